"""How fast `simulate` runs: 10,000 requests (input 2000, output 1000, closed loop 2048) of
deepseek-v3 on 72 H200 GPUs as 4 x DEP8 prefill + 1 x DEP40 decode, against a bare SimPy loop
of the same event count, and (--series) how the cost scales with requests and GPUs.

Run: .venv/bin/python benchmarks/simulate_speed.py [--requests N] [--profile]
     .venv/bin/python benchmarks/simulate_speed.py --series [--max-requests 100000]

The headline run (in this process, calibration tables loaded first and not counted) prints:
- wall time of a first run and of a second one in the same process (kernel-table grids built);
- CPU time: `time.process_time()` around the first `simulate`, against the target of
  1.0 s for 10,000 requests on 72 GPUs;
- the floor: SimPy events the run processed (each one popped off the environment's queue) per
  CPU second, beside a bare SimPy loop (a few processes yielding timeouts, nothing else) of the
  same event count: the ratio is how much work rackplan does per event above SimPy's own cost;
- simulated tokens per wall-second;
- peak memory: the process's peak resident set (calibration tables included) and, from a
  third, traced run, the peak of Python allocations during `simulate` (tracemalloc slows the
  run, so it is not a timed one).

--series then runs each scaling case in a fresh subprocess of this script (`--case`), so its
peak memory is its own: requests 1k / 10k / 100k / 1M on the 72-GPU layout, and 72 / 288 /
1,152 GPUs (1x, 4x, 16x the 72-GPU layout, the same traffic) at 10k requests. The table gives,
per case: requests completed, engine steps, SimPy events, CPU seconds of `simulate`, CPU
microseconds per request, the resident set after loading the calibration and the case's peak
resident set (the difference is the simulation's share). Below it: the CPU ratio of each 10x
step in requests (linear: 10x) and of 4x / 16x GPUs (sub-linear: under 4x / 16x), and the
the targets (10k requests on 72 GPUs <= 1.0 CPU s; 1M requests <= 60 CPU s and <= 1 GB).
The script reports against the targets; it asserts none. --max-requests skips the cases above
it (1M takes minutes) and caps the GPU series' requests; --series-gpus picks GPU counts. Each
case has a timeout (--case-timeout); a failed or timed-out case prints its reason in its row.
Progress goes to stderr as each case starts and ends.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import simpy

from simulator.calibration import load_calibration
from simulator.des import simulate
from simulator.des.metrics import SimResult
from simulator.specs.deployment import Deployment, RoleSpec, Speculative
from simulator.specs.hardware import load_hardware
from simulator.specs.workload import ClosedArrival, FixedLength, Workload

UNIT_GPUS = 72
"""GPUs of one copy of the layout: 4 x DEP8 prefill + 1 x DEP40 decode."""


def deployment(gpus: int = UNIT_GPUS) -> Deployment:
    """`gpus // 72` copies of the 72-GPU layout as one deployment (validated)."""
    copies = gpus // UNIT_GPUS
    return Deployment(
        model="deepseek-v3", hardware="h200", gpus=gpus,
        prefill=RoleSpec(instances=4 * copies, dep=8),
        decode=RoleSpec(instances=copies, dep=40, redundant_experts=24,
                        speculative=Speculative(tokens=1, acceptance=0.8)),
    )


DEPLOYMENT = deployment()
WORKLOAD = Workload(arrival=ClosedArrival(concurrency=2048), requests=10_000,
                    input_tokens=FixedLength(value=2000), output_tokens=FixedLength(value=1000))

REQUEST_SERIES = (1_000, 10_000, 100_000, 1_000_000)
"""Requests of the series on the 72-GPU layout."""
GPU_SERIES = (72, 288, 1152)
"""GPUs of the series at `GPU_SERIES_REQUESTS` requests."""
GPU_SERIES_REQUESTS = 10_000
HEADLINE_TARGET_CPU_S = 1.0
"""The target: 10k requests on 72 GPUs in at most this much simulation CPU."""
MILLION_TARGET_CPU_S, MILLION_TARGET_MIB = 60.0, 1024.0
"""The target for 1M requests: CPU seconds and peak memory."""


# ---- measuring ---------------------------------------------------------------------------


@contextmanager
def counting_events() -> Iterator[Callable[[], int]]:
    """Within the block, every SimPy environment created is remembered; the function yielded
    returns the events they processed so far (scheduled, less those still queued). It wraps
    `Environment.__init__` only, so stepping runs at full speed."""
    envs: list[simpy.Environment] = []
    init = simpy.core.Environment.__init__

    @functools.wraps(init)
    def remembering(self: simpy.Environment, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        envs.append(self)

    def processed() -> int:
        # _eid is an itertools.count: reading it takes one number, which no event will get.
        return sum(next(env._eid) - len(env._queue) for env in envs)

    with mock.patch.object(simpy.core.Environment, "__init__", remembering):
        yield processed


@dataclass(frozen=True)
class Timed:
    """One `simulate` run and what it cost."""

    result: SimResult
    events: int
    """SimPy events processed."""
    cpu_s: float
    wall_s: float


def timed_simulate(dep: Deployment, workload: Workload) -> Timed:
    """`simulate` with its CPU and wall time and SimPy event count."""
    with counting_events() as processed:
        cpu, wall = time.process_time(), time.perf_counter()
        result = simulate(dep, workload)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return Timed(result, processed(), cpu, wall)


def bare_simpy(events: int, processes: int = 16) -> tuple[int, float]:
    """A SimPy loop that does nothing but process `events` events: a few processes yielding
    timeouts. Returns the events it processed and its CPU seconds (best of three)."""
    processes = max(1, min(processes, events // 4))
    # Each process is started (one event) and ends (one event); the rest are timeouts.
    base, extra = divmod(max(events - 2 * processes, 0), processes)

    def worker(env: simpy.Environment, i: int) -> Generator[simpy.Event, None, None]:
        delay = 1.0 + i / processes
        for _ in range(base + (i < extra)):
            yield env.timeout(delay)

    best, done = float("inf"), 0
    for _ in range(3):
        env = simpy.Environment()
        for i in range(processes):
            env.process(worker(env, i))
        cpu = time.process_time()
        env.run()
        best = min(best, time.process_time() - cpu)
        done = next(env._eid) - len(env._queue)
    return done, best


def peak_rss_mib() -> float:
    """This process's peak resident set so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes there, KiB here


def rss_mib() -> float:
    """This process's resident set now (its peak so far where /proc is missing)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return peak_rss_mib()
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def load_tables() -> None:
    """Load the calibration tables first: reading parquet files is not simulation time."""
    load_calibration(load_hardware("h200")).load_all()


# ---- the headline run --------------------------------------------------------------------


def headline(requests: int, gpus: int, profile: bool) -> None:
    dep, workload = deployment(gpus), WORKLOAD.model_copy(update={"requests": requests})
    load_tables()
    if profile:
        import cProfile
        import pstats
        with cProfile.Profile() as prof:
            first = timed_simulate(dep, workload)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    else:
        first = timed_simulate(dep, workload)
    result = first.result
    start = time.perf_counter()
    simulate(dep, workload)
    warm = time.perf_counter() - start
    rss = peak_rss_mib()
    tracemalloc.start()
    simulate(dep, workload)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    floor_events, floor_cpu = bare_simpy(first.events)
    m = result.metrics()
    print(f"wall time: {first.wall_s:.2f} s for {m['completed']} requests, {result.steps} engine "
          f"steps ({result.priced_steps} composed by the cost model, "
          f"{100 * result.priced_steps / max(result.steps, 1):.2f} %; {result.expert_loads} "
          f"signatures finished from them); {warm:.2f} s run again in "
          "the same process (kernel-table grids already built)")
    target = (f"target <= {HEADLINE_TARGET_CPU_S:.1f} s for {GPU_SERIES_REQUESTS:,} requests on "
              f"{UNIT_GPUS} GPUs")
    print(f"CPU time: {first.cpu_s:.2f} s of simulation CPU for {requests:,} requests on {gpus:,} "
          f"GPUs ({target})")
    rate = first.events / max(first.cpu_s, 1e-9)
    floor = floor_events / max(floor_cpu, 1e-9)
    print(f"rackplan {rate:,.0f} events/s vs bare SimPy {floor:,.0f} events/s (the floor): "
          f"{floor / max(rate, 1e-9):.1f} x ({first.events:,} events in {first.cpu_s:.2f} CPU s; "
          f"the bare loop's {floor_events:,} in {floor_cpu * 1e3:.1f} ms)")
    print(f"simulated tokens per wall-second: {result.total_tokens / first.wall_s:,.0f} "
          f"({result.total_tokens:,} tokens, {m['duration_s']:.1f} simulated s)")
    print(f"peak memory: {rss:.0f} MiB resident (process); {peak / 2**20:.1f} MiB allocated "
          "by simulate (tracemalloc)")
    print(json.dumps({k: m[k] for k in ("throughput_tok_s_gpu", "ttft_ms", "tpot_ms",
                                        "expert_imbalance", "step_breakdown")}))


# ---- the scaling series ------------------------------------------------------------------


def run_case(requests: int, gpus: int) -> None:
    """One case of the series, in a process of its own; prints its figures as one JSON line."""
    load_tables()
    rss_calibration = rss_mib()
    t = timed_simulate(deployment(gpus), WORKLOAD.model_copy(update={"requests": requests}))
    print(json.dumps({"completed": t.result.metrics()["completed"], "steps": t.result.steps,
                      "events": t.events, "cpu_s": t.cpu_s, "wall_s": t.wall_s,
                      "rss_calibration_mib": rss_calibration, "peak_rss_mib": peak_rss_mib()}))


def short(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else (
        f"{n // 1000}k" if n % 1000 == 0 else str(n))


def spawn_case(requests: int, gpus: int, timeout_s: float) -> dict[str, Any] | str:
    """Run one case in a subprocess: its figures, or why there are none."""
    cmd = [sys.executable, __file__, "--case", "--requests", str(requests), "--gpus", str(gpus)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:.0f} s (--case-timeout)"
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        why = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return f"failed (exit {r.returncode}): {why}"
    try:
        figures: dict[str, Any] = json.loads(lines[-1])
    except json.JSONDecodeError:
        return f"failed: unreadable output {lines[-1][:80]!r}"
    return figures


def series(max_requests: int, gpu_counts: list[int], timeout_s: float) -> None:
    gpu_requests = min(GPU_SERIES_REQUESTS, max_requests)
    cases = [(n, UNIT_GPUS) for n in REQUEST_SERIES if n <= max_requests]
    cases += [(gpu_requests, g) for g in gpu_counts if (gpu_requests, g) not in cases]
    skipped = [n for n in REQUEST_SERIES if n > max_requests]
    done: dict[tuple[int, int], dict[str, Any]] = {}
    rows = []
    for i, (n, g) in enumerate(cases, 1):
        label = f"{short(n)} requests on {g:,} GPUs"
        print(f"[{i}/{len(cases)}] {label} ...", file=sys.stderr, flush=True)
        out = spawn_case(n, g, timeout_s)
        if isinstance(out, str):
            print(f"[{i}/{len(cases)}] {label}: {out}", file=sys.stderr, flush=True)
            rows.append(f"{short(n) + '@' + str(g):<10} {n:>9,} {g:>6,}  {out}")
            continue
        done[n, g] = out
        print(f"[{i}/{len(cases)}] {label}: {out['cpu_s']:.2f} CPU s, "
              f"{out['peak_rss_mib']:.0f} MiB peak", file=sys.stderr, flush=True)
        rows.append(f"{short(n) + '@' + str(g):<10} {n:>9,} {g:>6,} {out['completed']:>10,} "
                    f"{out['steps']:>8,} {out['events']:>10,} {out['cpu_s']:>8.2f} "
                    f"{out['cpu_s'] / max(n, 1) * 1e6:>8.0f} {out['rss_calibration_mib']:>9.0f} "
                    f"{out['peak_rss_mib']:>9.0f}")
    print("\nscaling series (each case in its own process; CPU s of simulate only; RSS MiB "
          "after loading the calibration, and the case's peak)")
    print(f"{'case':<10} {'requests':>9} {'GPUs':>6} {'completed':>10} {'steps':>8} "
          f"{'events':>10} {'CPU s':>8} {'us/req':>8} {'RSS cal':>9} {'peak RSS':>9}")
    for row in rows:
        print(row)
    for n in skipped:
        print(f"{short(n) + '@' + str(UNIT_GPUS):<10} {n:>9,} {UNIT_GPUS:>6,}  skipped "
              f"(--max-requests {max_requests:,})")
    scaling(done, gpu_requests, gpu_counts, max_requests)


def scaling(done: dict[tuple[int, int], dict[str, Any]], gpu_requests: int,
            gpu_counts: list[int], max_requests: int) -> None:
    """The CPU ratios between cases, and the targets."""
    def cpu(n: int, g: int) -> float | None:
        return done[n, g]["cpu_s"] if (n, g) in done else None

    steps = []
    for a, b in itertools.pairwise(REQUEST_SERIES):
        ca, cb = cpu(a, UNIT_GPUS), cpu(b, UNIT_GPUS)
        if ca and cb:
            steps.append(f"{short(a)} -> {short(b)}: {cb / ca:.1f} x")
    print(f"\nCPU ratio per 10x requests ({UNIT_GPUS} GPUs; linear: 10 x): "
          + ("; ".join(steps) or "needs two request cases"))
    base, ratios = cpu(gpu_requests, UNIT_GPUS), []
    for g in gpu_counts:
        c = cpu(gpu_requests, g)
        if base and c and g != UNIT_GPUS:
            ratios.append(f"{g // UNIT_GPUS} x GPUs ({g:,}): {c / base:.1f} x")
    print(f"CPU ratio per more GPUs ({short(gpu_requests)} requests; sub-linear: below the GPU "
          "factor): " + ("; ".join(ratios) or f"needs the {UNIT_GPUS}-GPU case and another"))
    c = cpu(GPU_SERIES_REQUESTS, UNIT_GPUS)
    print(f"target {short(GPU_SERIES_REQUESTS)} requests on {UNIT_GPUS} GPUs <= "
          f"{HEADLINE_TARGET_CPU_S:.1f} CPU s: "
          + (f"{c:.2f} s ({'met' if c <= HEADLINE_TARGET_CPU_S else 'missed'})"
             if c is not None else "not run"))
    big = done.get((1_000_000, UNIT_GPUS))
    head = (f"target 1M requests <= {MILLION_TARGET_CPU_S:.0f} CPU s and <= "
            f"{MILLION_TARGET_MIB:.0f} MiB peak: ")
    if big is None:
        why = f"--max-requests {max_requests:,}" if max_requests < 1_000_000 else "failed"
        print(head + f"not run ({why})")
    else:
        met = big["cpu_s"] <= MILLION_TARGET_CPU_S and big["peak_rss_mib"] <= MILLION_TARGET_MIB
        print(head + f"{big['cpu_s']:.1f} s, {big['peak_rss_mib']:.0f} MiB "
              f"({'met' if met else 'missed'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true",
                        help="print a cProfile summary of the headline run")
    parser.add_argument("--requests", type=int, default=WORKLOAD.requests,
                        help=f"requests of the headline run (default {WORKLOAD.requests:,}; the "
                             "tests run a small number)")
    parser.add_argument("--gpus", type=int, default=UNIT_GPUS,
                        help=f"GPUs of the headline run, a multiple of {UNIT_GPUS} (copies of "
                             f"the 72-GPU layout; default {UNIT_GPUS})")
    parser.add_argument("--series", action="store_true",
                        help="after the headline, run the scaling series, each case in its own "
                             "process")
    parser.add_argument("--max-requests", type=int, default=REQUEST_SERIES[-1],
                        help="series: skip cases of more requests than this, and run the GPU "
                             f"series at most at this many (default {REQUEST_SERIES[-1]:,})")
    parser.add_argument("--series-gpus", type=int, nargs="+", default=list(GPU_SERIES),
                        help="series: the GPU counts to run (default "
                             f"{' '.join(map(str, GPU_SERIES))})")
    parser.add_argument("--case-timeout", type=float, default=1200.0,
                        help="series: seconds a case may run before it is reported as timed "
                             "out (default 1200)")
    parser.add_argument("--case", action="store_true",
                        help="run one series case (--requests, --gpus) and print it as JSON "
                             "(what --series runs in each subprocess)")
    args = parser.parse_args()
    for g in [args.gpus, *args.series_gpus]:
        if g < UNIT_GPUS or g % UNIT_GPUS:
            parser.error(f"{g} GPUs is not a multiple of {UNIT_GPUS} (the 4 x DEP8 + 1 x DEP40 "
                         "layout); give 72, 144, 288, ...")
    for name in ("requests", "max_requests"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least 1")
    if args.case:
        run_case(args.requests, args.gpus)
        return
    headline(args.requests, args.gpus, args.profile)
    sys.stdout.flush()  # before the series' progress lines on stderr
    if args.series:
        series(args.max_requests, args.series_gpus, args.case_timeout)


if __name__ == "__main__":
    main()
