"""Search speed: the loop's own cost per trial (asking TPE, checking, screening, telling the
storage) as the study grows, with a fake evaluation that costs nothing, so that only the search
is timed. Prints seconds per trial over trials 2-50 and 151-200 (a flat cost reads about the
same), and how long 1 and N workers take with an evaluation that sleeps.

Run: .venv/bin/python benchmarks/search_speed.py [--trials 200] [--storage sqlite|journal]
     [--screen] [--workers 4] [--sleep 0.2]

--demo instead runs the default search (`make demo`: `rackplan search` on its built-in defaults,
one worker) in this process on a fresh storage in a temporary folder, and prints its CPU
seconds (this process and its children, against the 30 s target), the simulations, the CPU
they took, their engine steps and the share of steps the cost model composed (against 2 %),
and how many of those steps' signatures were finished from a composed step with another expert
load, and the plan it chose. --repeat N runs it N times, each in a fresh process (the step
memo and the operation prices are per process), and prints each run's figures and the range.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.planner.fakes

from planner.objectives import metric_value
from planner.plan import describe, summarize
from planner.search import SearchConfig, finished, records, run_search
from planner.space import build_space
from simulator.specs.deployment import Deployment
from simulator.specs.workload import ClosedArrival, FixedLength, Workload
from tests.planner.fakes import BatchTradeoff

WORKLOAD = Workload(arrival=ClosedArrival(concurrency=8), requests=16,
                    input_tokens=FixedLength(value=512), output_tokens=FixedLength(value=16))


class Sleepy:
    """BatchTradeoff after a fixed sleep: a stand-in for a simulation's cost (picklable)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, d: Deployment) -> dict[str, Any]:
        time.sleep(self.seconds)
        return BatchTradeoff()(d)


def config(folder: str, storage: str, **kw: Any) -> SearchConfig:
    url = f"journal:{folder}/s.log" if storage == "journal" else f"sqlite:///{folder}/s.db"
    space = build_space("deepseek-r1", "h200", 32)
    return SearchConfig(space=space, workload=WORKLOAD, storage=url, **kw)


def per_trial(args: argparse.Namespace) -> None:
    stamps: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        cfg = config(folder, args.storage, trials=args.trials, screen=args.screen, seed=0)
        start = time.perf_counter()
        run_search(cfg, evaluate=BatchTradeoff(),
                   progress=lambda n, _trials: stamps.append(time.perf_counter()))
    times = [b - a for a, b in zip([start, *stamps], stamps, strict=False)]
    n = len(times)
    first, last = times[1:50], times[max(n - 50, 1):]  # trial 1 also opens the study
    print(f"{n} trials ({args.storage}, screen {'on' if args.screen else 'off'}): "
          f"{sum(times):.1f} s; s/trial over trials 2-50: {sum(first) / len(first):.4f}, "
          f"over {n - len(last) + 1}-{n}: {sum(last) / len(last):.4f}")


def workers(args: argparse.Namespace) -> None:
    best = {}
    for w in (1, args.workers):
        with tempfile.TemporaryDirectory() as folder:
            cfg = config(folder, args.storage, trials=40, screen=False, seed=0, workers=w)
            start = time.perf_counter()
            study = run_search(cfg, evaluate=Sleepy(args.sleep))
            wall = time.perf_counter() - start
            summary = summarize(records(finished(study)))
            best[w] = summary.best["deployment"] if summary.best else None
            print(f"workers={w}: 40 trials, {summary.simulations} evaluations of "
                  f"{args.sleep} s each, {wall:.1f} s wall")
    print(f"same best plan with workers=1 and workers={args.workers}: "
          f"{best[1] == best[args.workers]}")


def cpu_s() -> float:
    """CPU seconds of this process and of its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def demo_once() -> dict[str, Any]:
    """The default search in this process: its figures (see the module docstring)."""
    import simulator.des as des
    from planner.cli import main as cli

    sims: list[tuple[float, int, int, int]] = []
    simulate = des.simulate

    def counted(*args: Any, **kwargs: Any) -> Any:
        start = cpu_s()
        result = simulate(*args, **kwargs)
        sims.append((cpu_s() - start, result.steps, result.priced_steps,
                     getattr(result, "expert_loads", 0)))
        return result

    des.simulate = counted
    printed = io.StringIO()
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(printed):
        start, wall = cpu_s(), time.perf_counter()
        cli(["search", "--storage", f"sqlite:///{folder}/demo.db", "--out",
             f"{folder}/plan.yaml", "--workers", "1", "--json"])  # simulations counted here
        cpu, wall = cpu_s() - start, time.perf_counter() - wall
    steps = sum(s[1] for s in sims)
    return {"cpu_s": cpu, "wall_s": wall, "simulations": len(sims),
            "simulation_cpu_s": sum(s[0] for s in sims), "steps": steps,
            "composed": sum(s[2] for s in sims), "expert_loads": sum(s[3] for s in sims),
            "plan": chosen(json.loads(printed.getvalue()))}


def chosen(search: dict[str, Any]) -> str:
    """The plan a search's --json output chose, in one line (or why there is none)."""
    best = search.get("best")
    if not best:
        return "no plan meets the SLOs"
    m = best["metrics"]
    slow = metric_value(m, "tok_s_user_p90")  # the SLO's sense: 90 % of requests at least
    return (f"{describe(best['deployment'])}: {m['throughput_tok_s_gpu']:,.0f} tok/s/GPU, "
            f"{slow or 0:,.1f} tok/s/user for 90 % of requests, TTFT p90 "
            f"{m['ttft_ms']['p90']:,.0f} ms")


def demo(repeat: int) -> None:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, __file__, "--demo-once"], check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    for r in runs:
        print(f"default search: {r['cpu_s']:.1f} CPU s (target 30), {r['wall_s']:.1f} s wall; "
              f"{r['simulations']} simulations, {r['simulation_cpu_s']:.1f} CPU s "
              f"({100 * r['simulation_cpu_s'] / r['cpu_s']:.0f} %); {r['steps']:,} steps, "
              f"{r['composed']:,} composed by the cost model "
              f"({100 * r['composed'] / max(r['steps'], 1):.2f} %, target 2 %), "
              f"{r['expert_loads']:,} signatures finished from them\n  plan: {r['plan']}")
    if len(runs) > 1:
        cpus = [r["cpu_s"] for r in runs]
        print(f"CPU s over {len(runs)} runs: {min(cpus):.1f}-{max(cpus):.1f}")


def main() -> None:
    if sys.argv[1:] == ["--demo-once"]:
        result = demo_once()
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--storage", choices=["sqlite", "journal"], default="sqlite")
    parser.add_argument("--screen", action="store_true", help="screen points analytically")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.2,
                        help="seconds per evaluation in the workers comparison")
    parser.add_argument("--demo", action="store_true",
                        help="time the default search instead (see above)")
    parser.add_argument("--repeat", type=int, default=1, help="--demo runs")
    args = parser.parse_args()
    if args.demo:
        demo(args.repeat)
        return
    per_trial(args)
    workers(args)


if __name__ == "__main__":
    main()
