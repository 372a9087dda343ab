"""Search quality: the search's best plan against the exhaustive optimum of a space small enough
to simulate point by point, with the search allowed at most 10% of the exhaustive simulations.

Space: DeepSeek-R1 on at most 32 H200 GPUs, P/D only, DEP8 or DEP16 per role, no redundant
experts, two prefill token budgets, three decode batch limits, MTP off or one token (144 points).
Prints both optima, the gap, and the simulations each used.
Run: .venv/bin/python benchmarks/search_quality.py [--tiny] [--trials N] [--seed S]
(--tiny: 20 points and a few requests, to check that it runs; takes well under a minute).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from typing import Any

from planner.evaluate import Simulator
from planner.objectives import SLO, THROUGHPUT, meets, metric_value
from planner.plan import describe, summarize
from planner.search import SearchConfig, finished, records, run_search, simulations
from planner.space import SearchSpace, build_space, check, deployment_from_params, enumerate_params
from simulator.specs.errors import SpecError
from simulator.specs.loading import dump_deployment
from simulator.specs.workload import ClosedArrival, LognormalLength, Workload

SLOS = (SLO("tok_s_user_p90", 30.0), SLO("ttft_p90_ms", 4000.0))
WORKLOAD = Workload(arrival=ClosedArrival(concurrency=96), requests=384,
                    input_tokens=LognormalLength(median=2000, sigma=0.6, max=16384),
                    output_tokens=LognormalLength(median=300, sigma=0.5, max=2048))


def make_space(tiny: bool) -> SearchSpace:
    """The restricted space (20 points with --tiny, else 144)."""
    space = build_space("deepseek-r1", "h200", 32 if not tiny else 24, layouts=("pd",),
                        deps=(8, 16), max_num_batched_tokens=(8192,) if tiny else (8192, 16384),
                        max_num_seqs=(16, 64) if tiny else (16, 64, 256), mtp_tokens=(0, 1),
                        all2all=("deepep_low_latency",), dbo=(False,))
    return dataclasses.replace(space, redundant={d: (0,) for d in space.deps})


def exhaustive(space: SearchSpace, evaluate: Simulator) -> tuple[dict[str, Any] | None, int]:
    """(best feasible record, simulations run) over every point of the space."""
    best: dict[str, Any] | None = None
    points = list(enumerate_params(space))
    runs = 0
    for i, params in enumerate(points):
        deployment = deployment_from_params(space, params)
        try:
            check(deployment, space)
        except SpecError:
            continue
        metrics = evaluate(deployment)
        runs += 1
        value = metric_value(metrics, THROUGHPUT) or 0.0
        if meets(metrics, SLOS) and (best is None or value > best["value"]):
            best = {"deployment": deployment, "metrics": metrics, "value": value}
        if sys.stderr.isatty():
            print(f"\rexhaustive: {i + 1}/{len(points)} points", end="", file=sys.stderr,
                  flush=True)
        elif (i + 1) % 20 == 0 or i + 1 == len(points):
            print(f"exhaustive: {i + 1}/{len(points)} points", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    return best, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="20 points, 48 requests each")
    parser.add_argument("--trials", type=int, default=80, help="search trials (default 80)")
    parser.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    parser.add_argument("--batch", type=int, default=SearchConfig.batch,
                        help=f"simulations chosen per round (default {SearchConfig.batch}; 1: "
                             "the fully sequential search)")
    parser.add_argument("--share", type=float, default=0.10,
                        help="simulations the search may run, as a share of the exhaustive "
                             "ones (default 0.10)")
    args = parser.parse_args()
    space = make_space(args.tiny)
    workload = WORKLOAD.model_copy(update={"requests": 48, "arrival": ClosedArrival(
        concurrency=16)}) if args.tiny else WORKLOAD
    evaluate = Simulator(workload)

    start = time.perf_counter()
    best, runs = exhaustive(space, evaluate)
    wall_ex = time.perf_counter() - start
    budget = max(int(runs * args.share), 1)

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        config = SearchConfig(space=space, workload=workload, slos=SLOS, trials=args.trials,
                              seed=args.seed, storage=f"sqlite:///{tmp}/quality.db",
                              max_simulations=budget, startup_trials=8, batch=args.batch)
        study = run_search(config)
        trials = finished(study)
        summary = summarize(records(trials), SLOS)
        used = simulations(trials)
    wall_search = time.perf_counter() - start

    print(f"space: {runs} feasible points of deepseek-r1 on {space.gpus} x h200; SLOs: "
          f"{', '.join(str(s) for s in SLOS)}")
    if best is None:
        print("exhaustive optimum: no point meets the SLOs")
    else:
        print(f"exhaustive optimum: {best['value']:,.1f} tok/s/GPU "
              f"({runs} simulations, {wall_ex:.1f} s): "
              f"{describe(dump_deployment(best['deployment']))}")
    found = summary.best
    if found is None:
        print(f"search best: none feasible ({used} simulations of {budget} allowed, "
              f"{len(trials)} trials, {wall_search:.1f} s)")
        return
    value = metric_value(found["metrics"], THROUGHPUT) or 0.0
    print(f"search best: {value:,.1f} tok/s/GPU ({used} simulations of {budget} allowed = "
          f"{used / max(runs, 1):.0%} of exhaustive, {len(trials)} trials, "
          f"{wall_search:.1f} s): {describe(found['deployment'])}")
    if best is not None:
        print(f"gap to the optimum: {1 - value / best['value']:.1%}")


if __name__ == "__main__":
    main()
