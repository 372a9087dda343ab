"""The search's objective function: a deployment -> its `simulate --json` metrics.

`Simulator` runs the discrete-event simulation exactly as `rackplan simulate` does (same serving
overheads, same default simulation options), so a plan's predicted metrics are what
`rackplan simulate plan.yaml` prints. Calibration tables are loaded once per process and
hardware, and reused by every evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from simulator.calibration import Calibration, load_calibration
from simulator.calibration.serving import (
    ServingOverhead,
    fitted_overhead,
    user_serving_overhead,
)
from simulator.calibration.tables import user_calibration_dir
from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware
from simulator.specs.model import ModelSpec
from simulator.specs.workload import Workload

if TYPE_CHECKING:  # the simulation loads where it runs (`rackplan step` prices without it)
    from simulator.des import SimOptions

Evaluate = Callable[[Deployment], dict[str, Any]]
"""A function from a deployment to metrics shaped like `simulate --json` (STYLE rule 7)."""

def calibration_for(deployment: Deployment) -> Calibration:
    """The kernel tables of a deployment's hardware and engine (load_calibration keeps one per
    process)."""
    return load_calibration(load_hardware(deployment.hardware), deployment.engine,
                            deployment.engine_version)


def measured_overhead(deployment: Deployment) -> ServingOverhead | None:
    """The serving latencies measured on the deployment's own hardware and engine, from the
    active calibration folder's serving_overhead.json ($RACKPLAN_CALIBRATION_DIR, as
    `--calibration DIR` sets it); None when there are none."""
    folder = user_calibration_dir()
    if folder is None:
        return None
    hardware = load_hardware(deployment.hardware).name
    return user_serving_overhead(folder, hardware, deployment.engine, deployment.disaggregated,
                                 fitted_overhead(deployment))


def overhead_for(deployment: Deployment) -> ServingOverhead:
    """The serving-stack latencies `rackplan simulate` applies to this deployment: those
    measured in the active calibration folder, else the fit on published measurements."""
    return measured_overhead(deployment) or fitted_overhead(deployment)


def sim_options(deployment: Deployment) -> SimOptions:
    """The simulation options `rackplan simulate` uses for this deployment."""
    from simulator.des import SimOptions

    return SimOptions.serving(overhead_for(deployment))


def check_workload_fits(workload: Workload, model: ModelSpec) -> None:
    """SpecError when the workload's requests do not fit the model's context: the spec's
    lengths, or every session turn or trace row (read here, as the simulation would)."""
    from simulator.specs.fits import check_fits_context, check_requests_fit
    from simulator.specs.workload import SessionsArrival, TraceArrival

    check_fits_context(workload, model)
    a = workload.arrival
    one = workload.mode == "prefill_only"  # a prefill-only turn samples one token
    if isinstance(a, SessionsArrival):
        from simulator.des.replay import corpus_lengths
        prompt, output = corpus_lengths(a, workload.seed)
        remedy = ("cap the synthetic corpus with `shape: {max_input: N}`" if a.traces is None
                  else f"shorten the turns of {a.traces}")
        check_requests_fit("session turns", prompt, 1 if one else output, model, remedy)
    elif isinstance(a, TraceArrival):
        from simulator.des.traces import arrival_trace
        t = arrival_trace(a, workload.requests)
        check_requests_fit("trace rows", t.input_len, 1 if one else t.output_len, model,
                           f"shorten the rows of {a.path}")


def at_workload(evaluate: Evaluate, workload: Workload) -> Evaluate:
    """`evaluate` under another workload (a load sweep's): its ``at(workload)``, which
    `Simulator` has; SpecError for an evaluation that cannot change its workload."""
    at = getattr(evaluate, "at", None)
    if at is None:
        raise SpecError(f"{type(evaluate).__name__} evaluates one workload only; a load sweep "
                        "needs an evaluation with at(workload)")
    result: Evaluate = at(workload)
    return result


class Simulator:
    """Evaluate by discrete-event simulation of one workload (picklable, for worker
    processes)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    def at(self, workload: Workload) -> Simulator:
        """The same evaluation under `workload`."""
        return Simulator(workload)

    def __call__(self, deployment: Deployment) -> dict[str, Any]:
        """The `simulate --json` metrics of `deployment` under the workload."""
        from simulator.des import simulate

        result = simulate(deployment, self.workload, calibration=calibration_for(deployment),
                          options=sim_options(deployment))
        return result.metrics()
