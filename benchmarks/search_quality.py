"""Search quality: the search's best plan against the exhaustive optimum of a space small enough
to simulate point by point, with the search allowed at most 10% of the exhaustive simulations.

Space: DeepSeek-R1 on at most 32 H200 GPUs, P/D only, DEP8 or DEP16 per role, no redundant
experts, two prefill token budgets, three decode batch limits, MTP off or one token (144 points).
Prints both optima, the gap, and the simulations each used.

Then the screen against the simulation on every point (the screen must never contradict the
simulation): the DES / screen ratio of each SLO metric and of throughput, and the false
negatives of the gate's plausibility test, i.e. the points the simulation finds feasible but
the gate would screen out as unable to meet an SLO, with the corrections and error margins as
they stand after the search's first K simulated pairs and, cross-validated, after random
samples of as many points as the search simulated (target 0). The worst cases, or when there
are none the feasible points nearest to being screened out, are listed screen vs DES.
With --loads (auto or a list of users) every point is also each load: the exhaustive optimum
is over deployment x load, and the search searches the load too (its curve sweep counted in
its simulations).
Run: .venv/bin/python benchmarks/search_quality.py [--tiny] [--trials N] [--seed S] [--loads auto]
(--tiny: 20 points and a few requests, to check that it runs; takes well under a minute).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.evaluate import Simulator, calibration_for, overhead_for
from planner.fidelity import Gate, Seen
from planner.load import at_load, ladder, load_text
from planner.objectives import SLO, THROUGHPUT, meets, metric_value
from planner.plan import describe, summarize
from planner.screen import Screen
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


@dataclass(frozen=True)
class Point:
    """One in-budget point of the space: its screen estimate and its simulated metrics."""

    deployment: dict[str, Any]
    layout: str
    screen: dict[str, Any]
    metrics: dict[str, Any]
    feasible: bool
    load: float | None = None
    """The offered load (None: the workload's own)."""

    @property
    def key(self) -> str:
        return point_key(self.deployment, self.load)

    def seen(self, number: int) -> Seen:
        """As the gate learns from a simulated point."""
        return Seen(number, self.layout, self.screen, self.metrics, self.feasible)


def point_key(deployment: dict[str, Any], load: float | None) -> str:
    return json.dumps([deployment, load], sort_keys=True)


def exhaustive(space: SearchSpace, workload: Workload, evaluate: Simulator,
               loads: tuple[float, ...] = ()) -> tuple[dict[str, Any] | None, list[Point]]:
    """(best feasible record, every in-budget point screened and simulated, at each load)."""
    best: dict[str, Any] | None = None
    params_list = [(p, load) for p in enumerate_params(space) for load in (loads or (None,))]
    points: list[Point] = []
    screens: dict[tuple[bool, float | None], Screen] = {}
    for i, (params, load) in enumerate(params_list):
        deployment = deployment_from_params(space, params)
        overhead = overhead_for(deployment)
        try:
            resolved = check(deployment, space, calibration_for(deployment), overhead=overhead)
        except SpecError:
            continue
        pd = deployment.disaggregated
        here = workload if load is None else at_load(workload, load)
        screen = screens.setdefault((pd, load), Screen(here, overhead))
        estimate = {**screen(resolved), "gpus": resolved.gpus}
        metrics = evaluate.at(here)(deployment)
        value = metric_value(metrics, THROUGHPUT) or 0.0
        feasible = meets(metrics, SLOS)
        points.append(Point(dump_deployment(deployment), "pd" if pd else "aggregated",
                            estimate, metrics, feasible, load))
        if feasible and (best is None or value > best["value"]):
            best = {"deployment": deployment, "metrics": metrics, "value": value,
                    "load": load}
        if sys.stderr.isatty():
            print(f"\rexhaustive: {i + 1}/{len(params_list)} points", end="", file=sys.stderr,
                  flush=True)
        elif (i + 1) % 20 == 0 or i + 1 == len(params_list):
            print(f"exhaustive: {i + 1}/{len(params_list)} points", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    return best, points


def rejected(gate: Gate, points: Sequence[Point], history: Sequence[Seen],
             skip: set[int]) -> list[tuple[Point, str]]:
    """The DES-feasible points (but those numbered in `skip`) that the gate's plausibility
    test, knowing `history`, rejects, with its reason."""
    out = []
    for i, p in enumerate(points):
        if i in skip or not p.feasible:
            continue
        why = gate.implausible(p.layout, p.screen, history)
        if why:
            out.append((p, why))
    return out


def screen_errors(points: Sequence[Point]) -> None:
    """DES / screen ratio of each SLO metric and of throughput over every point."""
    print("screen vs DES over every point (DES / screen: min, median, max):")
    for metric in (*(s.metric for s in SLOS), THROUGHPUT):
        ratios = []
        for p in points:
            a, b = metric_value(p.screen, metric), metric_value(p.metrics, metric)
            if a and b:
                ratios.append(b / a)
        if ratios:
            print(f"  {metric}: {min(ratios):.2f} {statistics.median(ratios):.2f} "
                  f"{max(ratios):.2f} ({len(ratios)} points)")


def show(gate: Gate, p: Point, history: Sequence[Seen], why: str = "") -> str:
    """A point's SLO metrics: screen, corrected by `history`, and DES."""
    parts = []
    for slo in SLOS:
        raw, sim = metric_value(p.screen, slo.metric), metric_value(p.metrics, slo.metric)
        if raw is None or sim is None:
            continue
        fixed = raw * gate.correction(slo.metric, p.layout, history)
        parts.append(f"{slo.metric} screen {raw:,.1f} corrected {fixed:,.1f} DES {sim:,.1f} "
                     f"(SLO {slo.value:g})")
    text = f"    {describe(p.deployment)}: {'; '.join(parts)}"
    return f"{text}\n      {why}" if why else text


def tightest(gate: Gate, points: Sequence[Point], history: Sequence[Seen],
             skip: set[int]) -> list[Point]:
    """DES-feasible points whose corrected estimate comes nearest to (or beyond) an SLO, the
    nearest first."""
    out = []
    for i, p in enumerate(points):
        if i in skip or not p.feasible:
            continue
        worst = -1.0
        for slo in SLOS:
            raw = metric_value(p.screen, slo.metric)
            if raw is not None:
                fixed = raw * gate.correction(slo.metric, p.layout, history)
                worst = max(worst, slo.violation({slo.metric: fixed}))
        out.append((worst, i, p))
    return [p for _, _, p in sorted(out, key=lambda t: (-t[0], t[1]))]


def false_negatives(points: Sequence[Point], searched: Sequence[tuple[str, Seen]],
                    budget: int, seed: int) -> None:
    """The false-negative report (see the module docstring)."""
    gate = Gate(SLOS, slack=SearchConfig.slack, margin=SearchConfig.margin)
    feasible = sum(p.feasible for p in points)
    by_key = {p.key: i for i, p in enumerate(points)}
    print(f"false negatives of the gate's plausibility test ({feasible} of {len(points)} "
          "points DES-feasible; target 0):")
    worst: list[tuple[Point, str, list[Seen]]] = []
    last: tuple[list[Seen], set[int]] = ([], set())
    for k in sorted({min(k, len(searched)) for k in (0, gate.min_pairs, len(searched) // 2,
                                                       len(searched))}):
        history = [h for _, h in searched[:k]]
        skip = {by_key[key] for key, _ in searched[:k] if key in by_key}
        bad = rejected(gate, points, history, skip)
        total = sum(p.feasible for i, p in enumerate(points) if i not in skip)
        print(f"  after the search's first {k} simulated pairs: {len(bad)} of {total}")
        worst.extend((p, why, history) for p, why in bad)
        last = (history, skip)
    rng = random.Random(seed)
    draws, bad_total, total = 20, 0, 0
    size = min(max(budget, 1), len(points) - 1)
    for _ in range(draws):
        sample = sorted(rng.sample(range(len(points)), size))
        history = [points[i].seen(i) for i in sample]
        bad = rejected(gate, points, history, set(sample))
        bad_total += len(bad)
        total += sum(p.feasible for i, p in enumerate(points) if i not in sample)
        worst.extend((p, why, history) for p, why in bad)
    print(f"  cross-validated, {draws} random samples of {size} simulated points: "
          f"{bad_total} of {total} = {bad_total / max(total, 1):.1%}")
    if worst:
        print("  worst cases (screen vs DES):")
        for p, why, history in worst[:5]:
            print(show(gate, p, history, why))
        return
    history, skip = last
    print(f"  none; the feasible points nearest to being screened out, after the search's "
          f"{len(history)} pairs (screen vs DES):")
    for p in tightest(gate, points, history, skip)[:3]:
        print(show(gate, p, history))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="20 points, 48 requests each")
    parser.add_argument("--trials", type=int, default=80, help="search trials (default 80)")
    parser.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    parser.add_argument("--batch", type=int, default=SearchConfig.batch,
                        help=f"simulations chosen per round (default {SearchConfig.batch}; 1: "
                             "the fully sequential search)")
    parser.add_argument("--loads", help="search the load too: auto or users, e.g. 24,48,96")
    parser.add_argument("--share", type=float, default=0.10,
                        help="simulations the search may run, as a share of the exhaustive "
                             "ones (default 0.10)")
    args = parser.parse_args()
    space = make_space(args.tiny)
    workload = WORKLOAD.model_copy(update={"requests": 48, "arrival": ClosedArrival(
        concurrency=16)}) if args.tiny else WORKLOAD
    evaluate = Simulator(workload)
    loads = ladder(workload, args.loads) if args.loads else ()

    start = time.perf_counter()
    best, points = exhaustive(space, workload, evaluate, loads)
    runs = len(points)
    wall_ex = time.perf_counter() - start
    budget = max(int(runs * args.share), 1)

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        config = SearchConfig(space=space, workload=workload, slos=SLOS, trials=args.trials,
                              seed=args.seed, storage=f"sqlite:///{tmp}/quality.db",
                              max_simulations=budget, startup_trials=8, batch=args.batch,
                              loads=loads)
        study = run_search(config)
        trials = finished(study)
        summary = summarize(records(trials), SLOS)
        used = simulations(trials)
        simulated = sorted((r for r in records(trials)
                            if r["stage"] == "simulated" and "reused" not in r),
                           key=lambda r: r["number"])
    wall_search = time.perf_counter() - start
    searched = [(point_key(r["deployment"], r.get("load")),
                 Seen(r["number"], r["layout"], r.get("screen"), r["metrics"],
                      bool(r.get("meets_slo")))) for r in simulated]

    at = f" at {len(loads)} loads each" if loads else ""
    print(f"space: {runs} feasible points{at} of deepseek-r1 on {space.gpus} x h200; SLOs: "
          f"{', '.join(str(s) for s in SLOS)}")
    if best is None:
        print("exhaustive optimum: no point meets the SLOs")
    else:
        print(f"exhaustive optimum: {best['value']:,.1f} tok/s/GPU "
              f"({runs} simulations, {wall_ex:.1f} s): "
              f"{describe(dump_deployment(best['deployment']))}"
              + (f" at {load_text(workload, best['load'])}" if best["load"] else ""))
    found = summary.best
    if found is None:
        print(f"search best: none feasible ({used} simulations of {budget} allowed, "
              f"{len(trials)} trials, {wall_search:.1f} s)")
    else:
        value = metric_value(found["metrics"], THROUGHPUT) or 0.0
        print(f"search best: {value:,.1f} tok/s/GPU ({used} simulations of {budget} allowed = "
              f"{used / max(runs, 1):.0%} of exhaustive, {len(trials)} trials, "
              f"{wall_search:.1f} s): {describe(found['deployment'])}"
              + (f" at {load_text(workload, found['load'])}" if found.get("load") else ""))
        if best is not None:
            print(f"gap to the optimum: {1 - value / best['value']:.1%}")
    screen_errors(points)
    false_negatives(points, searched, budget, args.seed)


if __name__ == "__main__":
    main()
