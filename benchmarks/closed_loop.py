"""The closed loop on this machine: calibrate, fit the serving latencies, predict, deploy, measure.

For the tiny-moe plans on the cpu hardware (vLLM's CPU build from .venv-engine):
1. calibration: `rackplan calibrate --device cpu --model tiny-moe` into OUT/calibration, with
   as many torch threads as the engine's worker gets (vLLM's CPU build binds its worker to all
   cores but one, which it keeps for the engine core and API server), or --calibration DIR
   reused;
2. each plan deployed for real with the local backend, once for all its concurrencies;
3. the serving latencies fitted on their own runs at concurrency 1 and 8 (their own prompts,
   after a discarded warm-up), never on the runs compared below: each plan's step overhead
   is what the measured TPOT p50 (the median over the runs, the figure compared below and the
   one `rackplan calibrate --from-run` fits) leaves over the simulated TPOT with no overhead
   (the calibrated kernels alone), a fixed part plus a part per running request
   (kernels.from_run.fit_step); the aggregated plan's API overhead
   is its measured TTFT p50 at concurrency 1 minus the simulated one; on the 1P+1D plan
   (--pd) the P/D handoff is the same residual with that API overhead. They go to
   DIR/serving_overhead.json (the P/D plan's to its `disaggregated` part), where `rackplan
   simulate --calibration DIR` finds them;
4. per concurrency (closed loop, the same input and output lengths and number of prompts for
   both): `vllm bench serve` through executor.bench.run_bench, with the engines' /metrics read
   before and after each run, and the prediction with the fitted latencies (`rackplan
   simulate` of OUT/plans/<plan>-c<N>.yaml with --calibration DIR reproduces it). The runs go
   in rounds, one run of each fitting load and each compared concurrency per round, so that
   the machine's swings in speed fall alike on the fit and on what it predicts. Every run
   sends prompts of its own (executor/prompts.py, seeds seed, seed + 1, ... in the order of
   the runs; no two alike within a run or across runs): vLLM's random dataset repeats its
   prompts over tiny-moe's 1,024 tokens, and a deployment serving a prompt again finds it in
   its prefix cache, which the simulated workload does not have (and vLLM's example KV
   connector, the CPU P/D handoff, ended engines on such hits). The engines' logged prefix
   hit rates go in the report;
5. teardown (also on an error or Ctrl-C), then OUT/closed-loop.json and OUT/closed-loop.md:
   predicted vs measured TTFT p50, TPOT p50, ITL p50 and output throughput, the prediction's
   error relative to the measurement, and whether it is within the targets (TPOT and
   throughput 10 %, TTFT 20 %).

    .venv/bin/python benchmarks/closed_loop.py [--calibration DIR] [--pd] [--quick] [--out DIR]

--replay DIR fits and predicts again the runs a loop recorded in DIR, with the simulator as it
is now, and writes the report to --out; it deploys nothing (`replay`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shutil
import statistics
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from executor.backends.base import write_atomic
from executor.backends.local import (
    LocalBackend,
    default_vllm,
    engine_venv,
    free_base_port,
    render_local,
)
from executor.bench import RESULT_FILE, run_bench
from executor.tinymodel import ensure_tiny_model
from kernels.from_run import FitRun, fit_serving
from planner.evaluate import sim_options
from planner.plan import load_plan_or_deployment
from simulator.calibration.serving import ServingOverhead, write_user_serving_overhead
from simulator.calibration.tables import calibration_dir
from simulator.des import SimOptions, simulate
from simulator.specs.deployment import Deployment
from simulator.specs.hardware import load_hardware
from simulator.specs.loading import dump_deployment, load_workload
from simulator.specs.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
PLANS = {"aggregated": ROOT / "examples/tiny-moe-cpu-agg.yaml",
         "pd": ROOT / "examples/tiny-moe-cpu-pd.yaml"}
"""The tiny-moe plans on the cpu hardware: one aggregated instance; 1 prefill + 1 decode."""
TARGETS = {"ttft_ms": 0.20, "tpot_ms": 0.10, "output_tok_s": 0.10}
"""Largest |predicted - measured| / measured that counts as within target (TTFT 20 %, TPOT and
output throughput 10 %; the loop's first targets were 30 / 20 / 20 %)."""
METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "output_tok_s")
"""Compared per concurrency: p50 latencies and the output throughput of the deployment."""
ENGINE_SERIES = {
    "requests": "vllm:e2e_request_latency_seconds_count",
    "tpot_s": "vllm:request_time_per_output_token_seconds_sum",
    "tpot_n": "vllm:request_time_per_output_token_seconds_count",
    "itl_s": "vllm:inter_token_latency_seconds_sum",
    "itl_n": "vllm:inter_token_latency_seconds_count",
    "queue_s": "vllm:request_queue_time_seconds_sum",
    "queue_n": "vllm:request_queue_time_seconds_count",
    "prefill_s": "vllm:request_prefill_time_seconds_sum",
    "prefill_n": "vllm:request_prefill_time_seconds_count",
    "ttft_s": "vllm:time_to_first_token_seconds_sum",
    "ttft_n": "vllm:time_to_first_token_seconds_count",
    "steps": "vllm:iteration_tokens_total_count",
    "step_tokens": "vllm:iteration_tokens_total_sum",
    "generated": "vllm:generation_tokens_total",
    "cache_queries": "vllm:prefix_cache_queries_total",
    "cache_hits": "vllm:prefix_cache_hits_total",
}
"""vLLM's Prometheus series read before and after each run. TPOT, ITL, queue and prefill times
are stamped by the engine core as it steps; TTFT by the API server as it handles the output."""
READY_TIMEOUT_S = 600.0
BENCH_TIMEOUT_S = 600.0
STREAM_GAP_MS = 0.5
"""A token that reaches the client more than this after the one before came in its own chunk;
closer ones came together in a burst."""


@dataclass(frozen=True)
class Settings:
    """What one closed-loop run measures."""

    concurrencies: tuple[int, ...] = (1, 4, 16)
    input_len: int = 64
    output_len: int = 64
    prompts_per_client: int = 16
    min_prompts: int = 32
    """Prompts per concurrency: max(min_prompts, prompts_per_client x concurrency). Runs of
    several seconds each (3-18 s here): this machine's cores switch between two speeds every
    second or so (`probe_cores`), and a run of one or two seconds caught one of them."""
    fit_prompts: int = 32
    """Prompts of each fitting run: max(fit_prompts, fit_per_client x its concurrency), as
    long as the compared runs: this host's cores run at a speed that depends on how they were
    loaded just before (`probe_cores`), so a fit on runs of three seconds described runs of
    fifteen badly."""
    fit_per_client: int = 16
    fit_concurrencies: tuple[int, ...] = (1, 8)
    """The fitting runs' loads: the first fits the API overhead (and the P/D handoff), all of
    them the step overhead, fixed and per running request (8: the decode batch the compared
    loads reach, max_num_seqs; none of them is compared)."""
    decode_contexts: tuple[int, ...] = (128, 448)
    """--pd: contexts (KV tokens a request starts with) of the decode_only benches."""
    decode_concurrency: int = 4
    warmup_prompts: int = 4
    repeats: int = 5
    """`vllm bench serve` runs per point (and for the fit): their median is the measurement,
    their range its spread. Five: on this machine two runs of three at one load measured 26-34 %
    slower than the third (2026-12-05), which a median of three does not outvote."""
    seed: int = 0
    """The first run's seed; each later `vllm bench serve` run of the loop takes the next, so
    that no run repeats the prompts of another (warm-up, fit, compared runs)."""
    probe_s: float = 10.0
    """Seconds of `probe_cores` on each core before the loop and after it (0: none)."""

    def prompts(self, concurrency: int) -> int:
        return max(self.min_prompts, self.prompts_per_client * concurrency)


QUICK = Settings(concurrencies=(1, 4), output_len=16, prompts_per_client=2, min_prompts=4,
                 fit_prompts=4, fit_per_client=2, fit_concurrencies=(1,), warmup_prompts=2,
                 repeats=1, probe_s=0.0,
                 decode_contexts=())
"""--quick: a smoke run of the whole loop in about two minutes."""


# ---- pure parts: workloads, the fit, engine metrics, the report ----------------------------

def workload_dict(s: Settings, concurrency: int, prompts: int, seed: int = 0) -> dict[str, Any]:
    """The closed-loop workload that both the simulation and `vllm bench serve` get (the
    seed of its prompts: `ClosedLoop.measure` gives each run its own)."""
    return {"arrival": {"kind": "closed", "concurrency": concurrency}, "requests": prompts,
            "input_tokens": {"kind": "fixed", "value": s.input_len},
            "output_tokens": {"kind": "fixed", "value": s.output_len}, "seed": seed}


def parse_prometheus(text: str, names: Iterable[str]) -> dict[str, float]:
    """The value of each named series in Prometheus text format, summed over its labels."""
    wanted = set(names)
    out = dict.fromkeys(wanted, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        if name in wanted:
            try:
                out[name] += float(value)
            except ValueError:
                continue
    return out


def engine_figures(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """What one instance's engine saw between two reads of its /metrics: requests, steps,
    mean tokens computed and generated per step (the latter is the mean decode batch), and the
    mean TPOT, ITL, queue, prefill and API-server TTFT in ms (None where no request
    contributed), and the share of prompt tokens its prefix cache served (None where none was
    looked up: the cache off, or no request)."""
    d = {k: after.get(s, 0.0) - before.get(s, 0.0) for k, s in ENGINE_SERIES.items()}

    def mean_ms(key: str) -> float | None:
        n = d[f"{key}_n"]
        return d[f"{key}_s"] / n * 1e3 if n > 0 else None

    return {"requests": round(d["requests"]), "steps": round(d["steps"]),
            "tokens_per_step": d["step_tokens"] / d["steps"] if d["steps"] > 0 else None,
            "generated_per_step": d["generated"] / d["steps"] if d["steps"] > 0 else None,
            **{f"{k}_mean_ms": mean_ms(k) for k in ("tpot", "itl", "queue", "prefill", "ttft")},
            "prefix_hit_rate": d["cache_hits"] / d["cache_queries"] if d["cache_queries"] > 0
            else None}


@dataclass(frozen=True)
class Point:
    """One plan at one concurrency: the prediction beside the measurement."""

    plan: str
    concurrency: int
    prompts: int
    predicted: dict[str, float | None]
    """METRICS as the simulation gives them."""
    measured: dict[str, float | None]
    """METRICS as `vllm bench serve` measured them at the client: the median over the runs."""
    spread: dict[str, list[float] | None] = field(default_factory=dict)
    """Per metric, the lowest and highest of the runs."""
    runs: int = 1
    streamed: float | None = None
    """Share of the tokens after each first one that reached the client in a chunk of their
    own (the rest came in bursts)."""
    engine: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per instance, what its engine saw over all runs (engine_figures)."""
    load: tuple[float, float] = (0.0, 0.0)
    """The machine's 1-minute load average before the first run and after the last."""

    def error(self, metric: str) -> float | None:
        """(predicted - measured) / measured; None when either is missing or measured is 0."""
        p, m = self.predicted.get(metric), self.measured.get(metric)
        if p is None or m is None or m == 0:
            return None
        return (p - m) / m

    def within(self, metric: str) -> bool | None:
        """Within the metric's target; None for a metric without one or without an error."""
        err = self.error(metric)
        if metric not in TARGETS or err is None:
            return None
        return abs(err) <= TARGETS[metric]

    def engine_tpot_error(self) -> float | None:
        """The predicted TPOT against the engine's own mean TPOT (vLLM's /metrics), which does
        not depend on how the tokens reach the client."""
        e, p = engine_view(self)["tpot_mean_ms"], self.predicted.get("tpot_ms")
        return None if e is None or p is None or e == 0 else (p - e) / e

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "load": list(self.load),
                "error": {m: self.error(m) for m in METRICS},
                "within_target": {m: self.within(m) for m in TARGETS},
                "engine_tpot_error": self.engine_tpot_error()}


def predicted_metrics(sim: Mapping[str, Any], gpus: int) -> dict[str, float | None]:
    """METRICS out of `simulate --json` (output throughput of the whole deployment)."""
    per_gpu = sim.get("output_tok_s_gpu")
    return {"ttft_ms": sim["ttft_ms"]["p50"], "tpot_ms": sim["tpot_ms"]["p50"],
            "itl_ms": sim["itl_ms"]["p50"],
            "output_tok_s": None if per_gpu is None else per_gpu * gpus}


def measured_metrics(bench: Mapping[str, Any]) -> dict[str, float | None]:
    """METRICS out of a `vllm bench serve --save-result` JSON."""
    def get(key: str) -> float | None:
        v = bench.get(key)
        return float(v) if isinstance(v, int | float) and math.isfinite(v) else None

    return {"ttft_ms": get("p50_ttft_ms"), "tpot_ms": get("p50_tpot_ms"),
            "itl_ms": get("p50_itl_ms"), "output_tok_s": get("output_throughput")}


def combine(results: Sequence[Mapping[str, Any]]) -> tuple[dict[str, float | None],
                                                        dict[str, list[float] | None]]:
    """The median of several runs' METRICS, and each metric's [lowest, highest]."""
    per_run = [measured_metrics(r) for r in results]
    median: dict[str, float | None] = {}
    spread: dict[str, list[float] | None] = {}
    for m in METRICS:
        values = sorted(v for r in per_run if (v := r[m]) is not None)
        if not values:
            median[m], spread[m] = None, None
            continue
        median[m] = statistics.median(values)
        spread[m] = [values[0], values[-1]]
    return median, spread


def streamed_share(results: Sequence[Mapping[str, Any]]) -> float | None:
    """Share of the inter-token gaps (`itls` of --save-detailed results) longer than
    STREAM_GAP_MS: tokens that reached the client on their own rather than in a burst."""
    gaps = [g for r in results for request in r.get("itls") or [] for g in request]
    if not gaps:
        return None
    return sum(g * 1e3 > STREAM_GAP_MS for g in gaps) / len(gaps)


def _num(v: Any, spec: str = ".3g") -> str:
    return "n/a" if v is None else format(v, spec)


def _err(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.0%}"


def _yes(v: bool | None) -> str:
    return "" if v is None else ("yes" if v else "no")


def _pair(a: float | None, b: float | None) -> str:
    return "" if a is None and b is None else f"{_num(a)} / {_num(b)}"


def _share(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"


def engine_view(point: Point) -> dict[str, Any]:
    """The engine figures of the instance that decodes (TPOT, tokens per step) and of the one
    that prefills (queue, prefill, the API server's TTFT), for the tables; on P/D also the
    decode instance's queue and first step of a handed-over request (its KV loaded, its tail
    computed) and its API server's TTFT, which the P/D TTFT adds to the prefill's."""
    decode = next((v for k, v in point.engine.items() if not k.startswith("prefill")), {})
    prefill = next((v for k, v in point.engine.items() if not k.startswith("decode")), {})

    def queue_prefill(e: Mapping[str, Any]) -> float | None:
        queue, pre = e.get("queue_mean_ms"), e.get("prefill_mean_ms")
        return None if queue is None or pre is None else queue + pre

    apart = decode is not prefill
    return {"tpot_mean_ms": decode.get("tpot_mean_ms"),
            "generated_per_step": decode.get("generated_per_step"),
            "queue_prefill_mean_ms": queue_prefill(prefill),
            "api_ttft_mean_ms": prefill.get("ttft_mean_ms"),
            "decode_queue_first_mean_ms": queue_prefill(decode) if apart else None,
            "decode_api_ttft_mean_ms": decode.get("ttft_mean_ms") if apart else None,
            "prefix_hit_rate": prefill.get("prefix_hit_rate")}


PROBE_WORK = 300_000
"""Iterations of the core probe's fixed pure-Python work (12-13 ms a sample at this machine's
faster speed)."""
PROBE_SLOW = 1.3
"""A probe sample over this multiple of the core's fastest ran slow."""
UNSTEADY = 0.2
"""Share of slow probe samples past which the report says the cores were not steady."""


def probe_cores(seconds: float) -> dict[str, dict[str, float]]:
    """How steady each core this process may run on is: a fixed piece of pure-Python work,
    pinned to the core, timed every 0.1 s for `seconds`. Per core: samples, the fastest, median
    and slowest ms, and the share of samples over PROBE_SLOW x the fastest. On this 2-core
    virtual machine a core switches between speeds up to 1.9x apart from one second to the
    next, even idle; work in bursts after idle gaps (this probe, an API server) ran slowest
    (2026-12-03: 12.4 against 22-25 ms here; with the system python3, 26-35 ms run back to
    back and about 50 ms with 0.3 s gaps). No fit follows that; the loop prints the probe so
    that its errors can be read against it."""
    cores = sorted(os.sched_getaffinity(0))
    out: dict[str, dict[str, float]] = {}
    try:
        for core in cores:
            os.sched_setaffinity(0, {core})
            times: list[float] = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started, x = time.perf_counter(), 0
                for i in range(PROBE_WORK):
                    x += i * i
                times.append((time.perf_counter() - started) * 1e3)
                time.sleep(0.1)
            times.sort()
            fast = times[0]
            out[str(core)] = {"samples": len(times), "fastest_ms": fast,
                              "median_ms": times[len(times) // 2], "slowest_ms": times[-1],
                              "slow_share": sum(t > PROBE_SLOW * fast for t in times)
                              / len(times)}
    finally:
        os.sched_setaffinity(0, cores)
    return out


def probe_line(probes: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str | None:
    """The core probes (`when` -> core -> figures) as one markdown line, None without any."""
    parts = [f"{when}: " + "; ".join(
        f"core {core} {p['fastest_ms']:.1f}-{p['slowest_ms']:.1f} ms, "
        f"{100 * p['slow_share']:.0f} % slow" for core, p in cores.items())
        for when, cores in probes.items() if cores]
    if not parts:
        return None
    line = (f"- core speed (the same pure-Python work pinned to each core every 0.1 s; slow: "
            f"over {PROBE_SLOW:g}x the core's fastest): " + "; ".join(parts))
    slow = max(p["slow_share"] for cores in probes.values() for p in cores.values())
    if slow > UNSTEADY:
        line += (f". The cores were not steady (up to {100 * slow:.0f} % of samples slow): the "
                 "errors below include the machine's own swings, not only the simulator's")
    return line


def to_markdown(report: Mapping[str, Any], points: list[Point]) -> str:
    """The report as markdown: settings, the fitted latencies, the comparison per point, and
    what the engines themselves saw."""
    s, fit = report["settings"], report["fit"]
    lines = [f"# Closed loop: tiny-moe on this machine ({report['date']})", "",
             f"- machine: {report['machine']['cpus']} CPU cores, no GPU; engine vLLM "
             f"{report['machine']['engine']}",
             *filter(None, [probe_line(report["machine"].get("core_probe", {}))]),
             f"- calibration: {report['calibration']['source']}, torch threads "
             f"{report['calibration']['threads']}",
             f"- workload: closed loop, input {s['input_len']} tokens, output {s['output_len']} "
             f"tokens, max({s['min_prompts']}, {s['prompts_per_client']} x concurrency) prompts "
             f"per run, {s['repeats']} run(s) per point (median; range in brackets)",
             "- fitted on their own runs at concurrency {loads}: aggregated step "
             "overhead {step} ms + {per} ms per running request, API overhead {api} ms "
             "({serial} ms of it serial); P/D step overhead {pd_step} ms + {pd_per} ms per "
             "running request, handoff "
             "{handoff}".format(
                 loads=", ".join(map(str, s.get("fit_concurrencies", (1,)))),
                 step=_num(fit.get("step_overhead_ms"), ".2f"),
                 per=_num(fit.get("step_overhead_per_seq_ms"), ".3f"),
                 api=_num(fit.get("api_overhead_ms"), ".1f"),
                 serial=_num(fit.get("api_serial_ms"), ".1f"),
                 pd_step=_num(fit.get("pd_step_overhead_ms"), ".2f"),
                 pd_per=_num(fit.get("pd_step_overhead_per_seq_ms"), ".3f"),
                 handoff=("not fitted" if fit.get("handoff_ms") is None
                          else f"{fit['handoff_ms']:.1f} ms")),
             "- error = (predicted - measured) / measured; targets: TPOT and output throughput "
             "within {tpot:.0%}, TTFT within {ttft:.0%}".format(
                 tpot=TARGETS["tpot_ms"], ttft=TARGETS["ttft_ms"]), "",
             "| plan | conc. | TTFT p50 ms: pred / meas [range] (err) | TPOT p50 ms | "
             "ITL p50 ms | output tok/s | within target: TTFT / TPOT / tput |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for p in points:
        cells = []
        for m in METRICS:
            rng = p.spread.get(m)
            bracket = "" if rng is None or p.runs < 2 else \
                f" [{_num(rng[0])}-{_num(rng[1])}]"
            cells.append(f"{_num(p.predicted.get(m))} / {_num(p.measured.get(m))}{bracket} "
                         f"({_err(p.error(m))})")
        lines.append(f"| {p.plan} | {p.concurrency} | " + " | ".join(cells) + " | "
                     + " / ".join(_yes(p.within(m)) for m in TARGETS) + " |")
    lines += ["", "What the engines saw (vLLM's /metrics, means over all runs of a point), and "
                  "how the tokens reached the client:", "",
              "| plan | conc. | prompts x runs | streamed tokens | TPOT ms: pred / engine (err) | "
              "engine decode batch | engine queue + prefill ms | API-server TTFT ms | "
              "P/D decode engine: queue + first step / API-server TTFT ms | "
              "prefix-cache hits | load before / after |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for p in points:
        if not p.engine:  # an isolated-role bench: its report has the client's figures only
            continue
        e = engine_view(p)
        lines.append(f"| {p.plan} | {p.concurrency} | {p.prompts} x {p.runs} | "
                     f"{_share(p.streamed)} | {_num(p.predicted['tpot_ms'])} / "
                     f"{_num(e['tpot_mean_ms'])} ({_err(p.engine_tpot_error())}) | "
                     f"{_num(e['generated_per_step'])} | "
                     f"{_num(e['queue_prefill_mean_ms'])} | {_num(e['api_ttft_mean_ms'])} | "
                     f"{_pair(e['decode_queue_first_mean_ms'], e['decode_api_ttft_mean_ms'])} | "
                     f"{_share(e['prefix_hit_rate'])} | {p.load[0]:.1f} / {p.load[1]:.1f} |")
    before = report.get("replayed", {}).get("points")
    if before:
        lines += ["", f"Replayed: each error as the loop of {report['replayed']['loop_date']} "
                      "predicted it -> as predicted now (targets met: "
                      f"{report['replayed']['met']} -> {targets_met(report['points'])[0]} of "
                      f"{report['replayed']['of']}):", "",
                  "| plan | conc. | " + " | ".join(METRICS) + " |",
                  "|---|---:|" + "---:|" * len(METRICS)]
        then = {(p["plan"], p["concurrency"]): p for p in before}
        for p in points:
            old = then.get((p.plan, p.concurrency), {}).get("error", {})
            lines.append(f"| {p.plan} | {p.concurrency} | " + " | ".join(
                f"{_err(old.get(m))} -> {_err(p.error(m))}" for m in METRICS) + " |")
    return "\n".join(lines) + "\n"


# ---- the loop: calibration, deployment, runs -----------------------------------------------

def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, text)


def engine_threads() -> int:
    """Threads of the engine's worker: vLLM's CPU build binds it to every core this process may
    use but one, which it keeps for the engine core and the API server."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def engine_version() -> str:
    """The engine environment's vLLM version, from its distribution metadata."""
    for meta in sorted(engine_venv().glob("lib/python*/site-packages/vllm-*.dist-info/METADATA")):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def calibrate(out: Path, quick: bool, threads: int) -> dict[str, Any]:
    """Run `rackplan calibrate` for tiny-moe on this CPU into `out`; its manifest."""
    from kernels.calibrate import calibrate as run

    return run("cpu", "tiny-moe", quick, out, threads=threads)


def _add_reads(total: dict[str, dict[str, float]], reads: Mapping[str, Mapping[str, float]]
               ) -> None:
    """Add one read of every instance's /metrics into `total` (series by series)."""
    for instance, series in reads.items():
        mine = total.setdefault(instance, {})
        for key, value in series.items():
            mine[key] = mine.get(key, 0.0) + value


def read_metrics(urls: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Every instance's ENGINE_SERIES from its /metrics."""
    out = {}
    for name, url in urls.items():
        with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
            out[name] = parse_prometheus(resp.read().decode(), ENGINE_SERIES.values())
    return out


@dataclass(frozen=True)
class Measured:
    """Runs of one workload: each run's `vllm bench serve` JSON, the engines' figures over all
    of them, and the load average before and after."""

    results: list[dict[str, Any]]
    engines: dict[str, dict[str, Any]]
    load: tuple[float, float]
    per_run: tuple[dict[str, dict[str, Any]], ...] = ()
    """The engines' figures of each run alone."""
    seed: int = 0
    """The first run's seed (its plan file's)."""

    def engine_tpot_ms(self) -> float | None:
        """The decoding engine's mean TPOT, the median over the runs (each run's mean from
        its own counters): one slow run (the first at a batch size, say) moves it less than it
        moves the mean over all of them."""
        got = [t for e in self.per_run
               if (t := engine_view(Point("", 0, 0, {}, {}, engine=e))["tpot_mean_ms"])
               is not None]
        return statistics.median(got) if got else None


class Loop:
    """One closed-loop run: calibration folder, output folder, and what was fitted."""

    def __init__(self, out: Path, calibration: Path, settings: Settings, model: str) -> None:
        self.out, self.calibration, self.settings, self.model = out, calibration, settings, model
        self.fit: dict[str, Any] = {}
        self.points: list[Point] = []
        self._seeds = itertools.count(settings.seed)
        """The next bench run's seed: no two runs send the same prompts."""

    def workloads(self, role: str) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """A plan's fitting workloads (by `fit_name`) and compared ones (`<role>-c<N>`)."""
        s = self.settings
        fits = {self.fit_name(role, c): workload_dict(s, c, max(s.fit_prompts,
                                                           s.fit_per_client * c))
                for c in s.fit_concurrencies}
        points = {f"{role}-c{c}": workload_dict(s, c, s.prompts(c)) for c in s.concurrencies}
        return fits, points

    def fit_name(self, role: str, concurrency: int) -> str:
        """The fitting runs' name at a load: `<role>-fit` at the first, `-fit-c<N>` after."""
        first = self.settings.fit_concurrencies[0]
        return f"{role}-fit" if concurrency == first else f"{role}-fit-c{concurrency}"

    def simulate(self, deployment: Deployment, workload: Workload,
                 overhead: ServingOverhead | None = None) -> dict[str, Any]:
        """`simulate --json` metrics with the calibration folder's tables and, unless given,
        its serving latencies (as `rackplan simulate PLAN --calibration DIR` gives them)."""
        with calibration_dir(self.calibration):
            options = sim_options(deployment) if overhead is None else SimOptions.serving(
                overhead)
            return simulate(deployment, workload, options=options).metrics()

    def plan_file(self, name: str, deployment: Deployment, workload: dict[str, Any],
                  predicted: dict[str, Any]) -> Path:
        """A plan.yaml that `rackplan simulate --calibration DIR` and run_bench read."""
        doc = {"format": 1, "deployment": dump_deployment(deployment), "workload": workload,
               "predicted": predicted}
        return write_text(self.out / "plans" / f"{name}.yaml",
                          f"# {name}: written by benchmarks/closed_loop.py\n"
                          + yaml.safe_dump(doc, sort_keys=False))

    def measure(self, backend: LocalBackend, deployment: Deployment,
                jobs: Mapping[str, dict[str, Any]], repeats: int = 1) -> dict[str, Measured]:
        """`repeats` rounds of `vllm bench serve` runs, one run of each named workload of
        `jobs` per round, in order, so that the machine's swings in speed fall alike on every
        workload (the fitting runs and the compared ones); each run with prompts of its own
        (the next seed; a workload's plan file records its first, with the prediction of the
        calibration folder's latencies at that time) and the engines' /metrics read around it.
        Per workload: its runs' JSON, the engines' figures over its runs (their counters'
        differences summed), the load average before its first run and after its last."""
        urls = {p.instance: f"http://127.0.0.1:{p.port}" for p in backend.rendered.processes
                if p.port is not None}
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in jobs}
        before: dict[str, dict[str, dict[str, float]]] = {name: {} for name in jobs}
        after: dict[str, dict[str, dict[str, float]]] = {name: {} for name in jobs}
        first_load: dict[str, float] = {}
        last_load: dict[str, float] = {}
        per_run: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in jobs}
        plans: dict[str, Path] = {}
        seeds: dict[str, int] = {}
        for i in range(repeats):
            for name, workload in jobs.items():
                seed = next(self._seeds)
                if name not in plans:
                    first = {**workload, "seed": seed}
                    plans[name] = self.plan_file(name, deployment, first, self.simulate(
                        deployment, load_workload(first)))
                    seeds[name] = seed
                run_dir = self.out / "runs" / name / f"run{i + 1}"
                b, load0 = read_metrics(urls), os.getloadavg()[0]
                run_bench(plans[name], backend.url, run_dir, model=self.model,
                          tokenizer=self.model, timeout_s=BENCH_TIMEOUT_S, detailed=True,
                          seed=seed)
                a, load1 = read_metrics(urls), os.getloadavg()[0]
                results[name].append(json.loads((run_dir / RESULT_FILE).read_text()))
                _add_reads(before[name], b)
                _add_reads(after[name], a)
                per_run[name].append({k: engine_figures(b[k], a[k]) for k in urls})
                first_load.setdefault(name, load0)
                last_load[name] = load1
        return {name: Measured(results[name], {k: engine_figures(before[name][k],
                                                                 after[name][k]) for k in urls},
                               (first_load[name], last_load[name]), tuple(per_run[name]),
                               seeds[name])
                for name in jobs}

    def run_plan(self, role: str, deployment: Deployment) -> None:
        """Deploy one plan, warm it up, fit what it fits, measure every concurrency, tear
        down (also on an error or Ctrl-C)."""
        n = sum(r.instances for r in deployment.roles.values())
        rendered = render_local(deployment, self.model, base_port=free_base_port(n))
        backend = LocalBackend(rendered, self.out / "deploy" / role)
        try:
            started = time.monotonic()
            backend.launch()
            backend.wait_ready(READY_TIMEOUT_S)
            say(f"{role}: ready in {time.monotonic() - started:.0f} s at {backend.url}")
            s = self.settings
            top = max(s.fit_concurrencies)  # every batch size the fit will see, once
            self.measure(backend, deployment, {f"{role}-warmup": workload_dict(
                s, top, max(s.warmup_prompts, 2 * top))})
            fits, points = self.workloads(role)
            got = self.measure(backend, deployment, {**fits, **points}, s.repeats)
            self.fit_on(role, deployment, fits, got)
            self.compare_on(role, deployment, points, got)
        finally:
            backend.teardown()
            left = backend.alive()
            if left:
                say(f"{role}: processes still alive after teardown: "
                    f"{', '.join(str(r.pid) for r in left)}")

    def fit_on(self, role: str, deployment: Deployment, fits: Mapping[str, dict[str, Any]],
               got: Mapping[str, Measured]) -> None:
        """From the fitting runs at each of `fit_concurrencies` (`fits`, measured in `got`
        after a discarded warm-up, never compared): each plan fits its own step overhead
        (fixed and per running request: on this host the P/D decode engine's API server
        shares its core) from the measured TPOT p50, the aggregated plan the API overhead
        from the first load's TTFT, the P/D plan the handoff with that API overhead. Written
        to the calibration folder's serving_overhead.json (the P/D plan's to its
        `disaggregated` part)."""
        s = self.settings
        runs: list[FitRun] = []
        for c in s.fit_concurrencies:
            name = self.fit_name(role, c)
            fit_load, measured = fits[name], got[name]
            # the p50s the runs measured, the figures each point is compared on (the engine's
            # own mean TPOT, vLLM's /metrics, is kept beside them: a mean over a run's
            # requests, which its slow stretches pull up)
            median = combine(measured.results)[0]
            ttft, tpot = median["ttft_ms"], median["tpot_ms"]
            for metric, value in (("TTFT", ttft), ("TPOT", tpot)):
                if value is None:
                    raise RuntimeError(f"the {role} fitting runs at concurrency {c} measured "
                                       f"no {metric}")
            if not runs:
                self.fit[f"{role}_streamed"] = streamed_share(measured.results)
            self.fit[f"{role}_ttft_p50_ms_c{c}"] = ttft
            self.fit[f"{role}_tpot_p50_ms_c{c}"] = tpot
            self.fit[f"{role}_engine_tpot_ms_c{c}"] = measured.engine_tpot_ms()
            runs.append((tpot, ttft, self._sim(deployment, load_workload(fit_load))))
        ttft = runs[0][1]
        loads = ", ".join(map(str, s.fit_concurrencies))
        about = {"fitted": datetime.now(UTC).date().isoformat(),
                 "command": "benchmarks/closed_loop.py",
                 "rule": f"runs of their own at concurrency {loads}: "
                         "TPOT p50 (median of the runs) - simulated kernels = fixed + "
                         "per request x requests a step runs; api = TTFT p50 - simulated "
                         "(aggregated, first load), its serial part from the TTFT p50 at the "
                         "other; handoff = P/D TTFT p50 - simulated"}
        if role == "aggregated":
            fitted, latencies = fit_serving(runs, False)
            self.fit.update(fitted, ttft_p50_ms=ttft)
        else:
            if "api_overhead_ms" not in self.fit:
                raise RuntimeError("the P/D handoff is fitted after the aggregated plan's API "
                                   "overhead; run the aggregated plan first")
            api = ServingOverhead(api_overhead_ms=self.fit["api_overhead_ms"],
                                  api_serial_ms=self.fit.get("api_serial_ms", 0.0))
            fitted, latencies = fit_serving(runs, True, api)
            self.fit.update({f"pd_{k}": v for k, v in fitted.items()},
                            handoff_ms=fitted["handoff_ms"], pd_ttft_p50_ms=ttft)
        write_user_serving_overhead(self.calibration, load_hardware(deployment.hardware).name,
                                    deployment.engine, latencies, about,
                                    disaggregated=role != "aggregated")
        say(f"{role}: fitted " + ", ".join(f"{k} {v:.3f}" for k, v in latencies.items()
                                           if v is not None))

    def _sim(self, deployment: Deployment, workload: Workload) -> Any:
        """The fit's view of one run: serving latencies -> metrics."""
        def sim(overhead: ServingOverhead) -> dict[str, Any]:
            return self.simulate(deployment, workload, overhead)
        return sim

    def compare_on(self, role: str, deployment: Deployment, points: Mapping[str, dict[str, Any]],
                   got: Mapping[str, Measured]) -> None:
        """Every concurrency's prediction with the fitted latencies (its plan file rewritten
        with it) beside its runs in `got`, measured with the same workload."""
        s = self.settings
        for c in s.concurrencies:
            name = f"{role}-c{c}"
            runs = got[name]
            w = {**points[name], "seed": runs.seed}
            sim_metrics = self.simulate(deployment, load_workload(w))
            self.plan_file(name, deployment, w, sim_metrics)
            measured, spread = combine(runs.results)
            point = Point(role, c, s.prompts(c),
                          predicted_metrics(sim_metrics, deployment.gpus_used), measured,
                          spread, len(runs.results), streamed_share(runs.results), runs.engines,
                          runs.load)
            self.points.append(point)
            say(f"{role} c={c}: " + ", ".join(
                f"{m} {_num(point.predicted[m])}/{_num(point.measured[m])}" for m in METRICS)
                + f", streamed {_share(point.streamed)}")

    def decode_only(self, deployment: Deployment) -> None:
        """The P/D plan's decode role alone (vLLM's DecodeBenchConnector fills each request's
        KV: no prefill) at each of `decode_contexts` and `decode_concurrency` users, as
        `rackplan bench --mode decode_only` runs it, beside the simulator's decode_only mode
        with the P/D fit: as many prompts as a compared point at that load, `repeats` runs
        (`--repeats`), their median compared."""
        from executor.sweep import bench_points

        s = self.settings
        c = s.decode_concurrency
        for context in s.decode_contexts:
            name = f"decode-only-ctx{context}"
            w = workload_dict(s, c, s.prompts(c), next(self._seeds))
            plan = self.plan_file(name, deployment, w, {})
            with calibration_dir(self.calibration):
                report = bench_points(plan, self.out / "decode-only" / name, [c],
                                      mode="decode_only", context=context, model=self.model,
                                      timeout_s=BENCH_TIMEOUT_S, num_prompts=s.prompts(c),
                                      repeats=s.repeats)
            (got,) = report.points
            point = Point(f"decode_only ctx {context}", c, s.prompts(c),
                          {m: got.row(r).predicted for m, r in DECODE_ROWS.items()},
                          {m: got.row(r).measured for m, r in DECODE_ROWS.items()})
            self.points.append(point)
            say(f"{point.plan} c={c}: " + ", ".join(
                f"{m} {_num(point.predicted[m])}/{_num(point.measured[m])}" for m in DECODE_ROWS))


DECODE_ROWS = {"tpot_ms": "tpot_ms.p50", "itl_ms": "itl_ms.p50",
               "output_tok_s": "output_throughput_tok_s"}
"""The decode_only bench's comparison rows behind the loop's metrics (it measures no TTFT)."""


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/closed-loop", help="folder for everything "
                        "written (default runs/closed-loop)")
    parser.add_argument("--calibration", metavar="DIR",
                        help="reuse this `rackplan calibrate` folder (the fit is written into "
                             "it) instead of calibrating into OUT/calibration")
    parser.add_argument("--threads", type=int, default=engine_threads(),
                        help="torch threads of the calibration (default: the engine worker's, "
                             f"{engine_threads()} here)")
    parser.add_argument("--pd", action="store_true",
                        help="also the 1 prefill + 1 decode plan (fits the P/D handoff)")
    parser.add_argument("--quick", action="store_true",
                        help="quick calibration, concurrencies 1 and 4, 16 output tokens")
    parser.add_argument("--concurrency", help="comma-separated concurrencies (default 1,4,16)")
    parser.add_argument("--replay", metavar="DIR", nargs="+",
                        help="fit and predict again the runs earlier loops measured into each "
                             "DIR (its runs, plans and calibration), with the simulator as it "
                             "is now; deploys nothing, writes OUT (several: OUT/<DIR's name> "
                             "each and OUT/replays.md, a line a loop)")
    args = parser.parse_args(argv)
    if args.replay:
        try:
            return replay_all([Path(d) for d in args.replay], Path(args.out))
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            print(f"closed_loop: error: {e}", file=sys.stderr)
            return 1
    settings = QUICK if args.quick else Settings()
    if args.concurrency:
        try:
            cs = tuple(int(c) for c in args.concurrency.split(","))
        except ValueError:
            cs = ()
        if not cs or min(cs) < 1:
            parser.error(f"--concurrency {args.concurrency!r} must be positive integers "
                         "separated by commas")
        settings = replace(settings, concurrencies=cs)
    if args.threads < 1:
        parser.error(f"--threads {args.threads} must be >= 1")
    try:
        return run(Path(args.out), args.calibration, settings, args.quick, args.threads,
                   ("aggregated", "pd") if args.pd else ("aggregated",))
    except KeyboardInterrupt:  # the deployment is torn down on the way out
        print("closed_loop: interrupted; every process started was ended", file=sys.stderr)
        return 130
    except Exception as e:  # one line for people; the logs are under OUT
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        failed = engine_failure(Path(args.out))
        print(f"closed_loop: error: {first} (logs under {args.out}"
              + (f"; an engine failed first: {failed}" if failed else "") + ")", file=sys.stderr)
        return 1


ENGINE_ERROR = re.compile(r"\b([A-Za-z]*(?:Error|Exception)): (.+)$")


def engine_failure(out: Path) -> str | None:
    """The first exception an engine of the loop's deployments logged (the newest log
    first), as `log: Type: message`: a request that fails because an engine process died says
    only that its connection was refused."""
    logs = sorted((out / "deploy").glob("*/logs/*.log"), key=lambda f: f.stat().st_mtime,
                  reverse=True)
    for log in logs:
        with open(log, errors="replace") as f:
            for line in f:
                m = ENGINE_ERROR.search(line)
                if m and "ERROR" in line:
                    return f"{log}: {m[1]}: {m[2].strip()}"
    return None


def run(out: Path, calibration: str | None, settings: Settings, quick: bool, threads: int,
        roles: tuple[str, ...]) -> int:
    if not default_vllm().exists():
        raise RuntimeError(f"the engine environment is missing ({default_vllm()}); run "
                           "`make engine`")
    out.mkdir(parents=True, exist_ok=True)
    probes: dict[str, dict[str, dict[str, float]]] = {}
    if settings.probe_s > 0:
        say(f"probing each core's speed for {settings.probe_s:g} s")
        probes["before"] = probe_cores(settings.probe_s)
    if calibration is not None:
        cal = Path(calibration)
        manifest_path = cal / "manifest.json"
        if not manifest_path.is_file():
            raise RuntimeError(f"--calibration {cal} holds no manifest.json; give a folder "
                               "written by `rackplan calibrate`")
        manifest = json.loads(manifest_path.read_text())
        source = f"reused ({'quick' if manifest.get('quick') else 'full'} sweep)"
    else:
        cal = out / "calibration"
        say(f"calibrating tiny-moe on this CPU with {threads} torch threads")
        manifest = calibrate(cal, quick, threads)
        source = f"measured now ({'quick' if quick else 'full'} sweep, " \
                 f"{manifest['wall_time_s']:.0f} s)"
    model = str(ensure_tiny_model())
    loop = Loop(out, cal, settings, model)
    for role in roles:
        deployment, _ = load_plan_or_deployment(PLANS[role])
        loop.run_plan(role, deployment)
        if role == "pd" and settings.decode_contexts:
            loop.decode_only(deployment)
    if settings.probe_s > 0:
        probes["after"] = probe_cores(settings.probe_s)
    report = {
        "date": datetime.now(UTC).date().isoformat(),
        "machine": {"cpus": os.cpu_count(), "gpu": None, "engine": engine_version(),
                    "core_probe": probes},
        "calibration": {"source": source, "threads": manifest["device"]["threads"],
                        "date": manifest.get("date")},
        "settings": asdict(settings), "targets": TARGETS, "fit": loop.fit,
        "points": [p.to_dict() for p in loop.points],
    }
    return write_report(out, report, loop.points)


def write_report(out: Path, report: Mapping[str, Any], points: list[Point],
                 echo: bool = True) -> int:
    """OUT/closed-loop.json and OUT/closed-loop.md, the markdown also printed (`echo`)."""
    md = to_markdown(report, points)
    write_text(out / "closed-loop.json", json.dumps(report, indent=2) + "\n")
    write_text(out / "closed-loop.md", md)
    if echo:
        print(md)
    return 0


# ---- a loop replayed: its recorded runs fitted and predicted again ---------------------------

def replay(src: Path, out: Path, echo: bool = True) -> int:
    """Fit and predict again what the loop in `src` measured, with the simulator as it is now:
    its runs' `vllm bench serve` JSON (SRC/runs), its compared points' seeds (SRC/plans), its
    calibration tables (copied to OUT/calibration, where the new fit is written) and its
    settings; the engines' figures and the core probe are the loop's. The same code gives the
    loop's own fit and predictions; a change to the simulator shows what it does to every
    point without deploying anything (or a machine whose cores run as they ran then)."""
    report_path = src / "closed-loop.json"
    if not report_path.is_file():
        raise RuntimeError(f"--replay {src} holds no closed-loop.json; give a folder a closed "
                           "loop wrote")
    if out.resolve() == src.resolve():
        raise RuntimeError(f"--out {out} is the replayed loop's own folder; give another")
    try:
        old = json.loads(report_path.read_text())
    except ValueError as e:
        raise RuntimeError(f"{report_path} is not JSON ({e}); give a report a closed loop "
                           "wrote") from None
    lacking = [k for k, kind in (("settings", dict), ("fit", dict), ("points", list))
               if not isinstance(old.get(k) if isinstance(old, dict) else None, kind)]
    if lacking:
        raise RuntimeError(f"{report_path} has no {', '.join(lacking)}; give a report a closed "
                           "loop wrote")
    known = {f.name for f in fields(Settings)}
    settings = Settings(**{k: tuple(v) if isinstance(v, list) else v
                           for k, v in old["settings"].items() if k in known})
    cal = out / "calibration"
    loop = Loop(out, cal, settings, "")
    roles = [role for role in ("aggregated", "pd") if (
        src / "runs" / loop.fit_name(role, settings.fit_concurrencies[0])).is_dir()]
    if not roles or not (src / "calibration" / "manifest.json").is_file():
        raise RuntimeError(f"--replay {src} holds no recorded runs (runs/aggregated-fit/...) "
                           "or no calibration/manifest.json; give the folder the loop itself "
                           "wrote")
    shutil.copytree(src / "calibration", cal, dirs_exist_ok=True)
    seen = {(p["plan"], p["concurrency"]): p for p in old["points"]}
    for role in roles:
        deployment, _ = load_plan_or_deployment(PLANS[role])
        fits, points = loop.workloads(role)
        got = {name: recorded(src, name, None) for name in fits}
        got.update({name: recorded(src, name, seen.get((role, w["arrival"]["concurrency"])))
                    for name, w in points.items()})
        for name, w in {**fits, **points}.items():  # what is simulated is what was sent
            sent = {r.get("num_prompts") for r in got[name].results}
            if sent != {w["requests"]}:
                raise RuntimeError(
                    f"{src / 'runs' / name}: its runs sent {sorted(map(str, sent))} prompts "
                    f"where the loop's settings give {w['requests']}; the report and the runs "
                    "are not of one loop")
        loop.fit_on(role, deployment, fits, got)
        for c in settings.fit_concurrencies:  # the engines' own TPOT: the loop's reading
            key = f"{role}_engine_tpot_ms_c{c}"
            loop.fit[key] = old["fit"].get(key)
        loop.compare_on(role, deployment, points, got)
        if role == "pd":
            loop.points += replayed_decode_only(loop, src, deployment)
    was = old["points"]
    met_then, of = targets_met(was)
    report = {**old, "date": datetime.now(UTC).date().isoformat(),
              "replayed": {"loop": str(src), "loop_date": old.get("date"), "met": met_then,
                           "of": of, "fit": old["fit"], "points": was},
              "fit": loop.fit, "points": [p.to_dict() for p in loop.points]}
    return write_report(out, report, loop.points, echo)


def targets_met(points: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(targets met, targets with an error) over a report's points."""
    marks = [v for p in points for v in p["within_target"].values() if v is not None]
    return sum(marks), len(marks)


def replay_all(srcs: Sequence[Path], out: Path) -> int:
    """`replay` of one loop into `out`; of several, each into OUT/<its folder's name>, with a
    line a loop (targets met, TTFT at 4 users, mean TTFT error, then and now) printed and
    written to OUT/replays.md."""
    if len(srcs) == 1:
        return replay(srcs[0], out)
    names = [s.name for s in srcs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RuntimeError(f"--replay names {', '.join(twice)} more than once; each loop's "
                           "folder name becomes its OUT subfolder")
    for src in srcs:  # every folder checked before anything is written
        if not (src / "closed-loop.json").is_file():
            raise RuntimeError(f"--replay {src} holds no closed-loop.json; give a folder a "
                               "closed loop wrote")
    lines = ["| loop | its date | targets met: then -> now | P/D TTFT at 4 users | "
             "aggregated TTFT at 4 users | mean abs TTFT error | API overhead, serial part now |",
             "|---|---|---|---|---|---|---|"]
    for src in srcs:
        say(f"replaying {src}")
        replay(src, out / src.name, echo=False)
        lines.append(replay_line(src.name, json.loads(
            (out / src.name / "closed-loop.json").read_text())))
    text = "\n".join(lines) + "\n"
    write_text(out / "replays.md", text)
    print(text)
    return 0


def replay_line(name: str, report: Mapping[str, Any]) -> str:
    """One replayed loop's line of replays.md."""
    then, now = report["replayed"]["points"], report["points"]

    def error(points: Sequence[Mapping[str, Any]], plan: str, c: int) -> float | None:
        got = [p["error"].get("ttft_ms") for p in points
               if p["plan"] == plan and p["concurrency"] == c]
        return got[0] if got else None

    def mean_abs(points: Sequence[Mapping[str, Any]]) -> float | None:
        errs = [abs(e) for p in points if (e := p["error"].get("ttft_ms")) is not None]
        return statistics.mean(errs) if errs else None

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1%}"

    fit = report["fit"]
    return (f"| {name} | {report['replayed']['loop_date']} | {report['replayed']['met']} -> "
            f"{targets_met(now)[0]} of "
            f"{report['replayed']['of']} | {_err(error(then, 'pd', 4))} -> "
            f"{_err(error(now, 'pd', 4))} | {_err(error(then, 'aggregated', 4))} -> "
            f"{_err(error(now, 'aggregated', 4))} | {pct(mean_abs(then))} -> "
            f"{pct(mean_abs(now))} | {_num(fit.get('api_serial_ms'), '.2f')} of "
            f"{_num(fit.get('api_overhead_ms'), '.2f')} ms |")


def recorded(src: Path, name: str, point: Mapping[str, Any] | None) -> Measured:
    """The runs of workload `name` the loop in `src` measured, as `Loop.measure` returned them
    (the engines' figures and load of its compared `point`, when it is one)."""
    runs = sorted((src / "runs" / name).glob("run*/" + RESULT_FILE),
                  key=lambda f: int(f.parent.name.removeprefix("run")))
    if not runs:
        raise RuntimeError(f"{src / 'runs' / name} holds no {RESULT_FILE}: the loop did not "
                           "finish the runs of this workload")
    plan = yaml.safe_load((src / "plans" / f"{name}.yaml").read_text())
    engines = dict(point["engine"]) if point else {}
    load = (float(point["load"][0]), float(point["load"][1])) if point else (0.0, 0.0)
    return Measured([json.loads(f.read_text()) for f in runs], engines, load, (),
                    int(plan["workload"]["seed"]))


def replayed_decode_only(loop: Loop, src: Path, deployment: Deployment) -> list[Point]:
    """The loop's decode_only points: measured as it measured them (its sweep reports),
    predicted again with the replay's P/D fit."""
    from executor.isolated import mode_for, predict_alone
    from planner.plan import load_plan_or_deployment as load_plan

    s, out = loop.settings, []
    c = s.decode_concurrency
    for context in s.decode_contexts:
        name = f"decode-only-ctx{context}"
        sweep = src / "decode-only" / name / "sweep.json"
        if not sweep.is_file():
            continue
        rows = {r["metric"]: r for r in json.loads(sweep.read_text())["points"][0]["comparison"]}
        _, workload = load_plan(src / "plans" / f"{name}.yaml")
        assert workload is not None
        with calibration_dir(loop.calibration):
            alone = predict_alone(deployment, workload, mode_for("decode_only"), context, c,
                                  s.prompts(c))
        got = alone.predicted
        predicted = {"tpot_ms": got["tpot_ms"]["p50"], "itl_ms": got["itl_ms"]["p50"],
                     "output_tok_s": got["output_tok_s_gpu"] * alone.deployment.gpus_used}
        out.append(Point(f"decode_only ctx {context}", c, s.prompts(c), predicted,
                         {m: rows[r]["measured"] for m, r in DECODE_ROWS.items()}))
    return out


if __name__ == "__main__":
    sys.exit(main())
