"""How fast the simulator replays AgentX session trees: N synthetic trees (all turns and
subagents, from turn 0) on one GB300 NVL72 rack of DeepSeek-V4-Flash (--model: another model on
the same deck, drafting by its own method, e.g. deepseek-v4.1-flash, the default search's),
P 20 x DEP2 + D 2 x DEP16, 256 lanes.

The target is 1,000 trees in 10 s on one core; prints the trees, requests, simulated seconds,
engine steps, the simulation's CPU and wall seconds and requests per CPU second.
--single-steps steps every engine one step at a time (SimOptions.macro_steps off, the
reference the macro-steps are tested against).
Run: .venv/bin/python benchmarks/agentx_speed.py [--trees N] [--lanes N] [--single-steps]
     [--model NAME]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.space import draft_method
from simulator.des import SimOptions, simulate
from simulator.des.agentx import generate
from simulator.specs.agentx import AgentxShape
from simulator.specs.deployment import Deployment, Precision, RoleSpec, Speculative
from simulator.specs.workload import SessionsArrival, Workload

DEPLOYMENT = Deployment(
    model="deepseek-v4-flash", hardware="gb300", gpus=72,
    precision=Precision(weights="fp4", kv_cache="fp8", indexer_cache="fp4"),
    prefill=RoleSpec(instances=20, dep=2, max_num_batched_tokens=16384),
    decode=RoleSpec(instances=2, dep=16, max_num_seqs=256, redundant_experts=16,
                    speculative=Speculative(tokens=3, acceptance=0.8)))


def _progress_lines(start: float, every_s: float = 30.0) -> Callable[[float], None]:
    """A line on stderr at most every `every_s` seconds with the share of requests done (the
    default run takes minutes on 2 cores)."""
    last = [start]

    def report(done: float) -> None:
        now = time.perf_counter()
        if now - last[0] >= every_s or done >= 1.0:
            last[0] = now
            print(f"simulating: {done:.0%} of requests done ({now - start:,.0f} s)",
                  file=sys.stderr, flush=True)

    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=1000, help="session trees (default 1,000)")
    ap.add_argument("--lanes", type=int, default=256, help="trees alive at once (default 256)")
    ap.add_argument("--single-steps", action="store_true",
                    help="one event per engine step (no macro-steps)")
    ap.add_argument("--model", default=DEPLOYMENT.model,
                    help=f"model preset on the same deck (default {DEPLOYMENT.model})")
    args = ap.parse_args()
    if args.trees < 1 or args.lanes < 1:
        ap.error(f"--trees={args.trees} and --lanes={args.lanes} must be >= 1")
    shape = AgentxShape(traces=args.trees)
    t0 = time.perf_counter()
    requests = sum(t.requests for t in generate(shape, 0))
    gen_s = time.perf_counter() - t0
    workload = Workload(arrival=SessionsArrival(concurrency=min(args.lanes, args.trees),
                                                shape=shape, start="turn0",
                                                sampling="sequential"),
                        requests=requests)
    t0, c0 = time.perf_counter(), time.process_time()
    deck = DEPLOYMENT.model_dump()
    deck["model"] = args.model
    deck["decode"]["speculative"]["method"] = draft_method(args.model)  # V4.1: DSpark drafts
    deployment = Deployment.model_validate(deck)
    res = simulate(deployment, workload, options=SimOptions(macro_steps=not args.single_steps),
                   progress=_progress_lines(t0))
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    m = res.metrics()
    print(f"{args.model}: {args.trees:,} trees, {requests:,} requests "
          f"({m['completed']:,} completed), {m['duration_s']:,.0f} simulated s, "
          f"{res.steps:,} engine steps: {cpu:,.1f} s CPU, "
          f"{wall:,.1f} s wall ({requests / cpu:,.0f} requests per CPU s; corpus generated in "
          f"{gen_s:.1f} s); target 1,000 trees in 10 s")


if __name__ == "__main__":
    main()
