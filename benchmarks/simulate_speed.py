"""How fast `simulate` runs: 10,000 requests (input 2000, output 1000, closed loop 2048) of
deepseek-v3 on 72 H200 GPUs as 4 x DEP8 prefill + 1 x DEP40 decode.

Prints wall time, simulated tokens per wall-second and peak memory: the process's peak resident
set (calibration tables included) and, from a second, traced run, the peak of Python
allocations during `simulate` (tracemalloc slows the run, so it is not the timed one).
Run: .venv/bin/python benchmarks/simulate_speed.py [--profile]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import tracemalloc

from simulator.calibration import load_calibration
from simulator.des import simulate
from simulator.specs.deployment import Deployment, RoleSpec, Speculative
from simulator.specs.hardware import load_hardware
from simulator.specs.workload import ClosedArrival, FixedLength, Workload

DEPLOYMENT = Deployment(
    model="deepseek-v3", hardware="h200", gpus=72,
    prefill=RoleSpec(instances=4, dep=8),
    decode=RoleSpec(instances=1, dep=40, redundant_experts=24,
                    speculative=Speculative(tokens=1, acceptance=0.8)),
)
WORKLOAD = Workload(arrival=ClosedArrival(concurrency=2048), requests=10_000,
                    input_tokens=FixedLength(value=2000), output_tokens=FixedLength(value=1000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="print a cProfile summary")
    parser.add_argument("--requests", type=int, default=WORKLOAD.requests,
                        help=f"requests to simulate (default {WORKLOAD.requests:,}; the tests "
                             "run a small number)")
    args = parser.parse_args()
    workload = WORKLOAD.model_copy(update={"requests": args.requests})
    # Load the calibration tables first: reading parquet files is not simulation time.
    load_calibration(load_hardware("h200")).load_all()
    start = time.perf_counter()
    if args.profile:
        import cProfile
        import pstats
        with cProfile.Profile() as prof:
            result = simulate(DEPLOYMENT, workload)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    else:
        result = simulate(DEPLOYMENT, workload)
    wall = time.perf_counter() - start
    start = time.perf_counter()
    simulate(DEPLOYMENT, workload)
    warm = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    tracemalloc.start()
    simulate(DEPLOYMENT, workload)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    m = result.metrics()
    print(f"wall time: {wall:.2f} s for {m['completed']} requests, {result.steps} engine steps "
          f"({result.priced_steps} priced by the cost model); {warm:.2f} s run again in the "
          "same process (kernel-table grids already built)")
    print(f"simulated tokens per wall-second: {result.total_tokens / wall:,.0f} "
          f"({result.total_tokens:,} tokens, {m['duration_s']:.1f} simulated s)")
    print(f"peak memory: {rss:.0f} MiB resident (process); {peak / 2**20:.1f} MiB allocated "
          "by simulate (tracemalloc)")
    print(json.dumps({k: m[k] for k in ("throughput_tok_s_gpu", "ttft_ms", "tpot_ms",
                                        "expert_imbalance", "step_breakdown")}))


if __name__ == "__main__":
    main()
