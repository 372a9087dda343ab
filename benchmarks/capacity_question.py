"""The capacity question a new user asks: "Kimi-K2 on 16 H200, 4K in / 1K out, P90 TTFT under
2 s, at least 30 tokens/s per user (90 % of requests) — and what if I had 32?", answered by
`rackplan search --loads auto` (the load is part of the answer), then by `--target-rate`: the
fewest GPUs for a rate. Prints, per question, the wall and CPU seconds, the trials and
simulations, and the plan (deployment, load, tokens/s per GPU and per user) or the reasons.

Run: .venv/bin/python benchmarks/capacity_question.py [--trials 100] [--gpus 16,32]
     [--target-rate 1req/s] [--no-screen]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOAD = Path(__file__).resolve().parent / "workloads" / "chat-4k1k.yaml"
SLOS = ("--slo", "ttft_p90_ms=2000", "--slo", "tok_s_user_p90=30")


def ask(args: list[str], folder: str, name: str) -> None:
    """Run one search in a child process and print what it answered and what it cost."""
    cmd = [sys.executable, "-m", "planner.cli", "search", "--model", "kimi-k2", "--hardware",
           "h200", "--workload", str(WORKLOAD), *SLOS, "--storage",
           f"sqlite:///{folder}/{name}.db", "--out", f"{folder}/{name}.yaml", "--json", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if not run.stdout.strip():
        print(f"{name}: failed ({run.stderr.strip().splitlines()[-1:]})")
        return
    out = json.loads(run.stdout)
    head = (f"{name}: {wall:.1f} s wall, {cpu:.1f} s CPU, {out['trials']} trials, "
            f"{out['simulations']} simulated")
    best = out["best"]
    if best is None:
        print(f"{head}: no plan; {'; '.join(out['advice'])}")
        return
    from planner.plan import describe

    m = best["metrics"]
    print(f"{head}: {describe(best['deployment'])} at {best.get('load')} users on "
          f"{m['gpus']} GPUs, {m['throughput_tok_s_gpu']:,.0f} tok/s/GPU, "
          f"{1000 / m['tpot_ms']['p90']:,.1f} tok/s/user for 90 %, "
          f"TTFT p90 {m['ttft_ms']['p90']:,.0f} ms; why: {out['why']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--gpus", default="16,32", help="budgets to ask about (default 16,32)")
    p.add_argument("--target-rate", default="1req/s",
                   help="the rate of the fewest-GPUs question (default 1req/s)")
    p.add_argument("--no-screen", action="store_true")
    a = p.parse_args()
    extra = ["--trials", str(a.trials), *(["--no-screen"] if a.no_screen else [])]
    with tempfile.TemporaryDirectory() as folder:
        for gpus in a.gpus.split(","):
            ask(["--gpus", gpus, "--loads", "auto", *extra], folder, f"kimi-{gpus}gpu")
        top = max(int(g) for g in a.gpus.split(","))
        ask(["--gpus", str(top), "--target-rate", a.target_rate, *extra], folder,
            f"kimi-target-{a.target_rate.replace('/', '_')}")


if __name__ == "__main__":
    main()
