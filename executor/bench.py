"""Measure a running deployment with `vllm bench serve` and compare with the plan's prediction.

The plan's workload becomes vLLM's random dataset: input and output lengths (fixed exactly,
uniform as a centre and a range ratio, log-normal at its mean), the number of prompts, and the
arrival (closed loop: --max-concurrency; poisson and bursty: --request-rate and --burstiness);
a prefix hit rate becomes a shared random prefix. What could not be mapped exactly is listed in
the report's notes. The benchmark's JSON (--save-result) is read back and set beside the
predicted TTFT, TPOT and ITL percentiles and the output and total throughputs, each with its
relative error (measured - predicted) / predicted. report.json and report.md go into the run
directory.

`bench_command` is the one place the benchmark's arguments are written: `run_bench` runs it
here, executor/benchjob.py puts it in a Kubernetes Job. `compare_file` compares a result
measured elsewhere (such a Job's, `rackplan bench PLAN --from-file RESULT.json`) through the
same comparison; it also reads aiperf's summary (profile_export_aiperf.json, what the AgentX
harness writes), its TTFT, TPOT and end-to-end percentiles and throughputs.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from executor.backends.base import LaunchError, write_atomic
from executor.backends.local import default_vllm, local_client_cores, log_tail, pinned
from simulator.specs.errors import SpecError
from simulator.specs.workload import (
    BurstyArrival,
    ClosedArrival,
    FixedLength,
    Length,
    LognormalLength,
    PoissonArrival,
    UniformLength,
    Workload,
)

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl")
PERCENTILE_METRICS = (*LATENCIES, "e2el")
"""--percentile-metrics: the latencies the result gives percentiles of."""
RESULT_FILE = "bench.json"


class BenchError(LaunchError):
    """`vllm bench serve` failed or wrote no usable result; the message quotes its log. A kind
    of LaunchError: the deployment could not be measured, and callers report both alike."""


@dataclass(frozen=True)
class BenchSettings:
    """The workload as `vllm bench serve` arguments (random dataset)."""

    input_len: int
    """--random-input-len: centre of the input lengths (after any shared prefix)."""
    output_len: int
    """--random-output-len: centre of the output lengths."""
    input_range: float = 0.0
    """Input lengths spread over input_len x (1 +- input_range)."""
    output_range: float = 0.0
    """Output lengths spread over output_len x (1 +- output_range)."""
    prefix_len: int = 0
    """--random-prefix-len: tokens every prompt shares (the prefix-cache hits)."""
    num_prompts: int = 1
    """--num-prompts."""
    max_concurrency: int | None = None
    """--max-concurrency (closed loop)."""
    request_rate: float | None = None
    """--request-rate (open loop); None sends all at once, bounded by max_concurrency."""
    burstiness: float = 1.0
    """--burstiness: the gamma shape of the gaps (1 is Poisson)."""
    seed: int = 0
    notes: tuple[str, ...] = ()
    """Where the mapping from the plan's workload is not exact."""
    dataset_path: str | None = None
    """A JSONL file of these prompts (executor/prompts.py: no two alike), sent as bench serve's
    custom dataset; None sends vLLM's random dataset."""

    def args(self) -> list[str]:
        """The dataset and traffic arguments."""
        if self.dataset_path is None:
            out = ["--dataset-name", "random", "--random-input-len", str(self.input_len),
                   "--random-output-len", str(self.output_len),
                   "--random-range-ratio", json.dumps(
                       {"input": self.input_range, "output": self.output_range},
                       separators=(",", ":")),
                   "--random-prefix-len", str(self.prefix_len)]
        else:  # lengths per prompt in the file, in its order, as written
            out = ["--dataset-name", "custom", "--dataset-path", self.dataset_path,
                   "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle"]
        out += ["--num-prompts", str(self.num_prompts), "--seed", str(self.seed),
                "--request-rate", "inf" if self.request_rate is None else f"{self.request_rate:g}",
                "--burstiness", f"{self.burstiness:g}"]
        if self.max_concurrency is not None:
            out += ["--max-concurrency", str(self.max_concurrency)]
        return out


def _length(name: str, spec: Length, notes: list[str]) -> tuple[int, float]:
    """(centre, range ratio) of a length distribution in vLLM's random dataset."""
    if isinstance(spec, FixedLength):
        return spec.value, 0.0
    if isinstance(spec, UniformLength):
        centre = (spec.low + spec.high) / 2
        if centre != int(centre):
            notes.append(f"{name}: uniform {spec.low}..{spec.high} centred on {round(centre)}")
        return round(centre), (spec.high - spec.low) / (spec.high + spec.low)
    if isinstance(spec, LognormalLength):
        mean = max(1, round(spec.mean))
        notes.append(f"{name}: lognormal (median {spec.median:g}, sigma {spec.sigma:g}) sent "
                     f"as fixed {mean}, its mean")
        return mean, 0.0
    raise SpecError(f"{name} of kind {spec.kind!r} has no random-dataset equivalent")


def bench_settings(workload: Workload, num_prompts: int | None = None) -> BenchSettings:
    """The `vllm bench serve` settings closest to `workload`; SpecError for what cannot run."""
    if workload.mode != "serve":
        raise SpecError(f"workload mode={workload.mode!r} cannot be measured by vllm bench "
                        "serve; use mode 'serve'")
    if num_prompts is not None and num_prompts < 1:
        raise SpecError(f"num_prompts={num_prompts} must be >= 1")
    notes: list[str] = []
    input_len, input_range = _length("input_tokens", workload.input_tokens, notes)
    output_len, output_range = _length("output_tokens", workload.output_tokens, notes)
    prefix = min(input_len - 1, round(workload.prefix_hit_rate * input_len))
    if prefix:
        notes.append(f"prefix_hit_rate {workload.prefix_hit_rate:g}: {prefix} shared prefix "
                     "tokens per prompt")
    if workload.sessions is not None:
        notes.append(f"sessions of {workload.sessions.turns} turns sent as independent requests")
    n = workload.requests if num_prompts is None else num_prompts
    if n != workload.requests:
        notes.append(f"{n} prompts instead of the plan's {workload.requests}")
    arrival = workload.arrival
    concurrency, rate, burstiness = None, None, 1.0
    if isinstance(arrival, ClosedArrival):
        concurrency = arrival.concurrency
    elif isinstance(arrival, PoissonArrival):
        rate = arrival.rate
    elif isinstance(arrival, BurstyArrival):
        rate, burstiness = arrival.rate, 1.0 / arrival.burstiness
    else:
        raise SpecError(f"workload arrival kind {arrival.kind!r} has no vllm bench serve "
                        "equivalent; use closed, poisson or bursty")
    return BenchSettings(input_len=input_len - prefix, output_len=output_len,
                         input_range=input_range, output_range=output_range, prefix_len=prefix,
                         num_prompts=n, max_concurrency=concurrency, request_rate=rate,
                         burstiness=burstiness, seed=workload.seed, notes=tuple(notes))


@dataclass(frozen=True)
class Comparison:
    """One metric, predicted and measured."""

    metric: str
    """e.g. ttft_ms.p90 or output_throughput_tok_s."""
    predicted: float | None
    measured: float | None

    @property
    def rel_error(self) -> float | None:
        """(measured - predicted) / predicted; None when either is missing or predicted is 0."""
        if self.predicted is None or self.measured is None or self.predicted == 0:
            return None
        return (self.measured - self.predicted) / self.predicted


@dataclass(frozen=True)
class Report:
    """A benchmark run set beside the plan's prediction."""

    plan: str
    url: str
    """The endpoint measured ("" when the result file does not say)."""
    gpus: int
    settings: BenchSettings | None
    """The benchmark settings of the plan's workload; None for a result file measured with
    a workload they cannot describe."""
    command: tuple[str, ...]
    """The benchmark command run here; empty for a result measured elsewhere."""
    rows: tuple[Comparison, ...]
    measured: dict[str, Any] = field(default_factory=dict)
    """The benchmark's own summary figures (counts, duration, means)."""
    paths: tuple[Path, ...] = ()
    """Files written: report.json and report.md."""
    result_file: str | None = None
    """The result file compared, for a result measured elsewhere (--from-file)."""
    mode: str = "serve"
    """serve (end to end), or the isolated-role mode benched (executor/isolated.py)."""

    def row(self, metric: str) -> Comparison:
        """The comparison of one metric; KeyError naming it when absent."""
        for r in self.rows:
            if r.metric == metric:
                return r
        raise KeyError(f"no metric {metric!r} in the report")

    def to_dict(self) -> dict[str, Any]:
        """report.json."""
        s = self.settings
        return {
            "plan": self.plan, "mode": self.mode, "url": self.url, "gpus": self.gpus,
            "settings": None if s is None else {k: v for k, v in s.__dict__.items()
                                                if k != "notes"},
            "notes": [] if s is None else list(s.notes), "command": list(self.command),
            "result_file": self.result_file,
            "comparison": [{"metric": r.metric, "predicted": r.predicted,
                            "measured": r.measured, "rel_error": r.rel_error}
                           for r in self.rows],
            "measured": self.measured,
        }

    def table(self) -> str:
        """The comparison as aligned plain text for a terminal."""
        head = ("metric", "predicted", "measured", "error")
        body = [(r.metric, _num(r.predicted, ".4g"), _num(r.measured, ".4g"),
                 "" if r.rel_error is None else f"{r.rel_error:+.1%}") for r in self.rows]
        widths = [max(len(row[i]) for row in (head, *body)) for i in range(4)]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                 for row in (head, *body)]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """report.md: a table of predicted vs measured with relative errors."""
        s = self.settings
        lines = [f"# Predicted vs measured: {self.plan}", "",
                 f"- endpoint: {self.url or 'not named'} ({self.gpus} GPUs)"]
        if self.result_file is not None:
            lines.append(f"- result: {self.result_file}, measured elsewhere")
        if s is not None:
            arrival = (f"closed loop, concurrency {s.max_concurrency}" if s.request_rate is None
                       else f"{s.request_rate:g} req/s (burstiness {s.burstiness:g})")
            lines.append(f"- traffic: {s.num_prompts} prompts, input {s.prefix_len + s.input_len}"
                         f" tokens, output {s.output_len} tokens, {arrival}")
        lines.append(f"- completed: {self.measured.get('completed')}, failed: "
                     f"{self.measured.get('failed')}, duration: "
                     f"{_num(self.measured.get('duration_s'), '.2f')} s")
        lines += [f"- note: {n}" for n in (s.notes if s is not None else ())]
        lines += ["", "| metric | predicted | measured | error |", "|---|---:|---:|---:|"]
        for r in self.rows:
            err = "" if r.rel_error is None else f"{r.rel_error:+.1%}"
            lines.append(f"| {r.metric} | {_num(r.predicted, '.4g')} | "
                         f"{_num(r.measured, '.4g')} | {err} |")
        return "\n".join(lines) + "\n"


def _num(v: Any, spec: str) -> str:
    return "n/a" if not isinstance(v, int | float) else format(v, spec)


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def compare(predicted: dict[str, Any], result: dict[str, Any], gpus: int) -> tuple[Comparison, ...]:
    """Rows of predicted (plan metrics, as `rackplan simulate --json` prints them) vs measured
    (`vllm bench serve --save-result` JSON)."""
    rows = []
    for m in LATENCIES:
        pred = predicted.get(f"{m}_ms") or {}
        for p in PERCENTILES:
            got = result.get(f"p{p}_{m}_ms", result.get(f"median_{m}_ms") if p == 50 else None)
            rows.append(Comparison(f"{m}_ms.p{p}", _float(pred.get(f"p{p}")), _float(got)))
    for name, key, bench_key in (("output_throughput_tok_s", "output_tok_s_gpu",
                                  "output_throughput"),
                                 ("total_throughput_tok_s", "throughput_tok_s_gpu",
                                  "total_token_throughput")):
        per_gpu = _float(predicted.get(key))
        rows.append(Comparison(name, None if per_gpu is None else per_gpu * gpus,
                               _float(result.get(bench_key))))
    return tuple(rows)


def served_model(url: str, timeout_s: float = 10.0) -> str:
    """The first model id that `url`/v1/models lists."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout_s) as resp:
            return str(json.loads(resp.read())["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise BenchError(f"{url}/v1/models did not name a model ({exc})") from None


def _stored_prediction(data: Any, repredict: bool) -> dict[str, Any] | None:
    """The prediction a plan.yaml's parsed `data` holds, which `load_prediction` compares
    against; None where it holds none or `repredict` asks for a new one."""
    predicted = data.get("predicted") if isinstance(data, dict) and not repredict else None
    return predicted if isinstance(predicted, dict) else None


def prediction_source(plan_path: Path, calibration: str | None = None) -> str:
    """Where `load_prediction` takes the predicted column of a bench of `plan_path` from: the
    tables of `calibration` (simulated now), the plan's own prediction, or, for a file without
    one, a simulation now of its workload (the built-in one for a bare deployment)."""
    from planner.plan import is_plan
    from simulator.specs.loading import read_yaml

    if calibration is not None:
        return f"simulated now with the tables in {calibration}"
    data = read_yaml(plan_path)
    if _stored_prediction(data, repredict=False) is not None:
        return "the plan's own"
    if is_plan(data) and isinstance(data.get("workload"), dict):
        return f"simulated now: {plan_path} holds no prediction, so under its workload"
    w = Workload().model_dump(mode="json", include={"arrival", "requests", "input_tokens",
                                                     "output_tokens"})
    return (f"simulated now: {plan_path} holds no prediction, so under the built-in workload "
            f"{json.dumps(w, separators=(', ', ': '))}")


def load_prediction(plan_path: Path, repredict: bool = False) -> tuple[
        Any, Workload, dict[str, Any]]:
    """(deployment, workload, predicted metrics) of a plan.yaml; a deployment YAML without a
    prediction, or any plan when `repredict`, is simulated now (with the calibration tables
    active now: `--calibration DIR` or $RACKPLAN_CALIBRATION_DIR)."""
    from planner.plan import load_plan_or_deployment
    from simulator.specs.loading import read_yaml

    deployment, workload = load_plan_or_deployment(plan_path)
    workload = workload or Workload()
    predicted = _stored_prediction(read_yaml(plan_path), repredict)
    if predicted is None:
        from planner.evaluate import calibration_for, sim_options
        from simulator.des import simulate

        predicted = simulate(deployment, workload, calibration=calibration_for(deployment),
                             options=sim_options(deployment)).metrics()
    return deployment, workload, predicted


def bench_command(settings: BenchSettings, url: str, model: str, result_dir: str, *,
                  tokenizer: str | None = None, result_file: str = RESULT_FILE,
                  exe: str = "vllm", detailed: bool = False) -> list[str]:
    """`vllm bench serve` against `url` (the router) with `settings`, saving its JSON as
    `result_dir`/`result_file`: the one place the benchmark's arguments are written (run_bench
    runs them here, executor/benchjob.py in a Kubernetes Job). `exe` is the vllm executable;
    `tokenizer` defaults to `model`; `detailed` also saves every request's timings."""
    return [exe, "bench", "serve", "--backend", "vllm", "--base-url", url.rstrip("/"),
            "--endpoint", "/v1/completions", "--model", model,
            "--tokenizer", tokenizer or model, *settings.args(), "--ignore-eos",
            "--percentile-metrics", ",".join(PERCENTILE_METRICS),
            "--metric-percentiles", ",".join(str(p) for p in PERCENTILES),
            "--save-result", "--result-dir", result_dir,
            "--result-filename", result_file, "--disable-tqdm",
            *(["--save-detailed"] if detailed else [])]


def run_bench(plan_path: str | Path, url: str, run_dir: str | Path, *,
              vllm: str | Path | None = None, model: str | None = None,
              tokenizer: str | None = None, num_prompts: int | None = None,
              timeout_s: float | None = None, detailed: bool = False,
              repredict: bool = False, seed: int | None = None) -> Report:
    """Run `vllm bench serve` against `url` with the plan's workload, compare with the plan's
    prediction, and write report.json and report.md (and bench.json, logs/bench.log) into
    `run_dir`. `detailed`: bench.json also holds every request's TTFT and inter-token gaps
    (--save-detailed). `repredict`: simulate the plan now instead of reading its prediction
    (see `load_prediction`). `seed`: the prompts' seed instead of the workload's (runs that
    repeat a workload against one deployment each take their own: an engine's prefix cache
    holds the prompts it has seen, which a repeated seed sends again). SpecError for a
    workload that cannot be benchmarked, BenchError when the benchmark fails."""
    plan_path, run_dir = Path(plan_path), Path(run_dir)
    deployment, workload, predicted = load_prediction(plan_path, repredict)
    settings = bench_settings(workload, num_prompts)
    if seed is not None:
        settings = replace(settings, seed=seed)
    url = url.rstrip("/")
    model = model or served_model(url)
    exe = Path(vllm) if vllm is not None else default_vllm()
    if not exe.exists():
        raise BenchError(f"the engine executable {exe} does not exist; run `make engine` or "
                         "pass vllm=")
    command, result, settings = measure(settings, url, model, run_dir, exe,
                                        tokenizer=tokenizer, timeout_s=timeout_s,
                                        detailed=detailed,
                                        cores=local_client_cores(deployment, url))
    return _write_report(Report(
        plan=str(plan_path), url=url, gpus=deployment.gpus_used, settings=settings,
        command=tuple(command), rows=compare(predicted, result, deployment.gpus_used),
        measured=_summary(result)), run_dir)


def measure(settings: BenchSettings, url: str, model: str, run_dir: Path, exe: Path, *,
            tokenizer: str | None = None, timeout_s: float | None = None,
            detailed: bool = False, result_file: str = RESULT_FILE,
            cores: tuple[int, ...] | None = None) -> tuple[list[str], dict[str, Any],
                                                           BenchSettings]:
    """Run `vllm bench serve` once with `settings` against `url`: (its command, its result
    JSON, the settings sent), the JSON saved as run_dir/`result_file` and the output in
    run_dir/logs/; BenchError quoting the log when it fails. The prompts are written first
    (`with_prompt_file`) unless the settings name a file. `cores`: the client runs there only
    (beside a pinned CPU deployment on this machine: `local_client_cores`)."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    result_path = run_dir / result_file
    result_path.unlink(missing_ok=True)
    if settings.dataset_path is None:
        prompts = run_dir / (Path(result_file).stem + ".prompts.jsonl")
        settings = with_prompt_file(settings, prompts, exe, tokenizer or model)
    command = bench_command(settings, url, model, str(run_dir.resolve()), tokenizer=tokenizer,
                            exe=str(exe), detailed=detailed, result_file=result_file)
    log = run_dir / "logs" / (Path(result_file).stem + ".log")
    start = time.monotonic()
    with open(log, "wb") as out, pinned(cores):
        try:
            proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout_s, check=False,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
        except subprocess.TimeoutExpired:
            raise BenchError(_with_tail(f"vllm bench serve ran past {timeout_s:g} s", log)) \
                from None
    if proc.returncode != 0 or not result_path.exists():
        raise BenchError(_with_tail(f"vllm bench serve exited with code {proc.returncode} "
                                    f"after {time.monotonic() - start:.0f} s", log))
    try:
        result = json.loads(result_path.read_text())
    except ValueError as exc:
        raise BenchError(f"{result_path} is not JSON ({exc})") from None
    return command, result, settings


def with_prompt_file(settings: BenchSettings, dest: Path, exe: Path,
                     tokenizer: str) -> BenchSettings:
    """`settings` sending prompts of their own, written to `dest` with the tokenizer by the
    interpreter beside the engine executable `exe` (executor/prompts.py): vLLM's random dataset
    repeats its prompts over a small vocabulary, and a repeat is a prefix-cache hit that no
    prediction counts. Without such an interpreter, `settings` as they were, with a note.
    BenchError when the writer fails."""
    from executor.prompts import PromptError, write_prompts

    python = Path(exe).parent / "python"
    if not python.exists():
        return replace(settings, notes=(*settings.notes, f"prompts: vLLM's random dataset (no "
                                        f"interpreter beside {exe} to write prompts of their "
                                        "own; over a small vocabulary its prompts repeat)"))
    try:
        summary = write_prompts(dest, tokenizer=tokenizer, python=python,
                                num_prompts=settings.num_prompts, input_len=settings.input_len,
                                output_len=settings.output_len,
                                input_range=settings.input_range,
                                output_range=settings.output_range,
                                prefix_len=settings.prefix_len, seed=settings.seed)
    except PromptError as exc:
        raise BenchError(str(exc)) from None
    note = (f"prompts: {summary['prompts']} of their own (executor/prompts.py, seed "
            f"{settings.seed}, words from {summary['words']} tokens), not vLLM's random "
            "dataset, whose prompts repeat over a small vocabulary")
    if summary["mismatched"]:
        note += f"; {summary['mismatched']} read back at another length than drawn"
    return replace(settings, dataset_path=str(dest.resolve()), notes=(*settings.notes, note))


def compare_file(plan_path: str | Path, result_path: str | Path, run_dir: str | Path, *,
                 repredict: bool = False) -> Report:
    """Compare a result measured elsewhere (`vllm bench serve --save-result` JSON, e.g. the
    one a bench Job saved, or aiperf's profile_export_aiperf.json) with the plan's prediction,
    and write report.json and report.md into `run_dir`; nothing is run. SpecError, in one
    sentence, for a file that is missing, not JSON, or holds no benchmark result."""
    plan_path, result_path, run_dir = Path(plan_path), Path(result_path), Path(run_dir)
    result = read_result(result_path)
    deployment, workload, predicted = load_prediction(plan_path, repredict)
    prompts = result.get("num_prompts")
    try:  # the result's own prompt count, when it says (a note if it is not the plan's)
        settings: BenchSettings | None = bench_settings(
            workload, prompts if isinstance(prompts, int) and prompts >= 1 else None)
    except SpecError:  # measured with a workload vllm bench serve cannot describe
        settings = None
    url = result.get("base_url")
    return _write_report(Report(
        plan=str(plan_path), url=url if isinstance(url, str) else "", gpus=deployment.gpus_used,
        settings=settings, command=(), rows=compare(predicted, result, deployment.gpus_used),
        measured=_summary(result), result_file=str(result_path)), run_dir)


RESULT_KEYS = ("completed", "duration", *(f"{s}_{m}_ms" for m in LATENCIES
                                           for s in ("median", "p50", "p90", "p99")))
"""Keys a benchmark result gives; a file with none of them is not one."""
AIPERF_LATENCIES = {"time_to_first_token": "ttft", "inter_token_latency": "tpot",
                    "request_latency": "e2el"}
"""aiperf's per-request latencies -> vLLM's names. aiperf's inter-token latency is each
request's (latency - TTFT) / (output tokens - 1), vLLM's TPOT; it gives no percentiles over
single gaps, so a result from aiperf has no ITL."""
AIPERF_SCALARS = {"request_count": "completed", "error_request_count": "failed",
                  "benchmark_duration": "duration", "request_throughput": "request_throughput",
                  "output_token_throughput": "output_throughput",
                  "total_token_throughput": "total_token_throughput"}
"""aiperf's aggregate metrics (their `avg`) -> vLLM's result keys."""
TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3, "sec": 1e3}


def read_result(path: Path) -> dict[str, Any]:
    """A benchmark result with vLLM's keys: `vllm bench serve --save-result` JSON as it is,
    or aiperf's profile_export_aiperf.json translated (`aiperf_result`); SpecError naming the
    file when it is missing, not JSON, or holds no benchmark result."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"result file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"result file {path} cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"result file {path} is not JSON ({exc.msg} at line {exc.lineno})") \
            from None
    if isinstance(data, dict) and isinstance(data.get("time_to_first_token"), dict):
        data = aiperf_result(data)
    if not isinstance(data, dict) or not any(k in data for k in RESULT_KEYS):
        raise SpecError(f"result file {path} holds no benchmark result; expected the JSON of "
                        "`vllm bench serve --save-result` (completed, p90_ttft_ms, ...) or "
                        "aiperf's profile_export_aiperf.json")
    for key in (*RESULT_KEYS, "failed", "output_throughput", "total_token_throughput"):
        value = data.get(key)
        if key in data and value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value < 0):
            raise SpecError(f"result file {path}: {key}={value!r} is not a number >= 0; the "
                            "benchmark's figures must be numbers")
    return data


def aiperf_result(export: dict[str, Any]) -> dict[str, Any]:
    """aiperf's profile_export_aiperf.json (one stats block per metric: unit, avg, p50, p90,
    p99, ...) as vLLM's result keys: latencies in ms (AIPERF_LATENCIES), aggregates from their
    `avg` (AIPERF_SCALARS); what aiperf does not give is left out."""
    out: dict[str, Any] = {}
    for tag, name in AIPERF_LATENCIES.items():
        block = export.get(tag)
        scale = TO_MS.get(str(block.get("unit", "ms"))) if isinstance(block, dict) else None
        if isinstance(block, dict) and scale is not None:
            for stat, key in (("avg", "mean"), *((f"p{p}", f"p{p}") for p in PERCENTILES)):
                value = _float(block.get(stat))
                if value is not None:
                    out[f"{key}_{name}_ms"] = value * scale
    for tag, key in AIPERF_SCALARS.items():
        block = export.get(tag)
        value = _float(block.get("avg")) if isinstance(block, dict) else None
        if value is not None:
            out[key] = round(value) if key in ("completed", "failed") else value
    return out


def median_result(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of one benchmark as one result: each figure every run gives as a number
    (counts, duration, throughputs, percentiles) at its median over the runs, `runs` their
    number and `spread` each such figure's [lowest, highest]; per-request lists are dropped. A
    noisy machine moves single runs by tens of percent; their median is the figure compared."""
    if not results:
        raise ValueError("median_result needs at least one result")
    out: dict[str, Any] = {}
    spread: dict[str, list[float]] = {}
    for key, first in results[0].items():
        values = [float(v) for r in results if isinstance(v := r.get(key), int | float)
                  and not isinstance(v, bool) and math.isfinite(v)]
        if len(values) == len(results):
            out[key] = statistics.median(values)
            spread[key] = [min(values), max(values)]
        elif not isinstance(first, list | dict):
            out[key] = first
    return {**out, "runs": len(results), "spread": spread}


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's own summary figures, for the report."""
    return {"completed": result.get("completed"), "failed": result.get("failed"),
            "duration_s": result.get("duration"),
            "request_throughput": result.get("request_throughput"),
            "total_input_tokens": result.get("total_input_tokens"),
            "total_output_tokens": result.get("total_output_tokens"),
            **{f"mean_{m}_ms": result.get(f"mean_{m}_ms") for m in PERCENTILE_METRICS},
            **({"runs": result["runs"]} if "runs" in result else {})}


def _write_report(report: Report, run_dir: Path) -> Report:
    """Write report.json and report.md into `run_dir`; the report with their paths."""
    paths = (run_dir / "report.json", run_dir / "report.md")
    report = replace(report, paths=paths)
    write_atomic(paths[0], json.dumps(report.to_dict(), indent=2) + "\n")
    write_atomic(paths[1], report.to_markdown())
    return report


def _with_tail(sentence: str, log: Path) -> str:
    tail = log_tail(log)
    body = "\n".join("  | " + line for line in tail) if tail else "  | (empty)"
    return f"{sentence}; last lines of {log}:\n{body}"

