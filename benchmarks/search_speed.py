"""Search speed: the loop's own cost per trial (asking TPE, checking, screening, telling the
storage) as the study grows, with a fake evaluation that costs nothing, so that only the search
is timed. Prints seconds per trial over trials 2-50 and 151-200 (a flat cost reads about the
same), and how long 1 and N workers take with an evaluation that sleeps.

Run: .venv/bin/python benchmarks/search_speed.py [--trials 200] [--storage sqlite|journal]
     [--screen] [--workers 4] [--sleep 0.2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.planner.fakes

from planner.plan import summarize
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--storage", choices=["sqlite", "journal"], default="sqlite")
    parser.add_argument("--screen", action="store_true", help="screen points analytically")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.2,
                        help="seconds per evaluation in the workers comparison")
    args = parser.parse_args()
    per_trial(args)
    workers(args)


if __name__ == "__main__":
    main()
