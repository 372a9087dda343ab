"""Fixed latencies of the serving stack around the engine, fitted on measured deployments.

A measured TTFT holds more than engine steps: the API server (HTTP, tokenization, routing: a fixed
part and a part per prompt token) and, for P/D, the handoff between prefill and decode (proxy hop,
transfer setup, the decode side picking the request up). Each engine step also carries a fixed cost
that the kernel tables do not (scheduling and launches the GPU does not hide).
`benchmarks/fit_serving_overhead.py` fits them per engine on the low-concurrency rows of a fixed
half of aiconfigurator-core's silicon sample (where queueing is negligible), and writes
`data/serving_overhead.json`; `rackplan validate` reports its error on the rows that were not
fitted as well.

The same latencies measured on one's own engine live beside one's own kernel tables: a
`rackplan calibrate` folder may hold `serving_overhead.json` (per hardware and engine, fitted by
`benchmarks/closed_loop.py`), preferred to the shipped fit while that folder is the active
calibration (planner.evaluate.overhead_for).
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from simulator.specs.errors import SpecError

FIT_MAX_CONCURRENCY = 8
"""Rows at or below this concurrency are queue-free enough to fit fixed latencies on."""


@dataclass(frozen=True)
class ServingOverhead:
    """Fixed latencies of one engine's serving stack, in ms."""

    api_overhead_ms: float = 0.0
    """Arrival to scheduler."""
    api_per_ktoken_ms: float = 0.0
    """Arrival to scheduler, for every 1,000 prompt tokens the prefix cache does not hold, on
    top of `api_overhead_ms`: the serving stack's time that grows with the prompt outside the
    engine's GPU work (fitted on prompts with no cached tokens; not charged on cached ones)."""
    step_overhead_ms: float | None = None
    """Per engine step; None: the cost model's default."""
    step_overhead_per_layer_ms: float = 0.0
    """Per engine step and decoder layer of the model, on top of `step_overhead_ms`: the small
    kernels every layer launches (norms, rotary embedding, KV-cache writes, activation
    quantisation) that no measured kernel table prices."""
    handoff_ms: float = 0.0
    """P/D handoff besides the KV bytes."""
    step_overhead_per_seq_ms: float = 0.0
    """Per engine step and request its busiest rank runs (measured on one's own engine)."""
    api_serial_ms: float = 0.0
    """The part of the API overhead the instance's API server spends on each request one at a
    time (measured on one's own engine; 0: a pure delay). A P/D request spends it at the
    prefill instance's API server and again at the decode instance's, which takes the request
    in anew from the proxy."""

    def api_ms(self, computed_tokens: float) -> float:
        """Arrival to scheduler for a prompt of which `computed_tokens` are not cached."""
        return self.api_overhead_ms + self.api_per_ktoken_ms * computed_tokens / 1e3


def in_fit_half(row_id: str) -> bool:
    """The fixed half of the measured rows that fitting may use (a hash of the row id)."""
    return zlib.crc32(row_id.encode()) % 2 == 0


FIT_MAX_LOADED_CONCURRENCY = 512
"""The per-request step overhead is fitted on the fitting half's aggregated rows above
FIT_MAX_CONCURRENCY users up to this many (the few rows beyond are mostly KV-bound queues), and
for P/D plans on its P/D rows up to this many requests a decode rank."""


def used_by_fit(row_id: str, mode: str, concurrency: float) -> bool:
    """Whether the shipped fit read a measured row: the fitting half's rows, aggregated ones at
    up to FIT_MAX_LOADED_CONCURRENCY users (the loaded ones for the per-request step overhead),
    P/D ones at any load (their users spread over many decode ranks)."""
    return in_fit_half(row_id) and (mode == "disagg" or concurrency <= FIT_MAX_LOADED_CONCURRENCY)


HARDWARE_KEY = "hardware"
"""The key of an engine entry's fixed API overheads fitted per hardware preset: the same serving
stack on different systems' hosts (CPUs, networks) spends different fixed times on a request;
the part per prompt token is the engine's, fitted on all its rows."""


@cache
def _table() -> dict[str, Any]:
    path = resources.files("simulator.calibration").joinpath("data/serving_overhead.json")
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


LAYERS_KEY = "layers"
"""The key of an engine entry's per-layer step overheads fitted per layer signature (the sorted
attention kinds of a model's decoder layers, `layer_signature`): a layer launches small kernels
that depend on its kind (an MLA layer's, a GQA layer's, a DSA layer's indexer, a linear
attention layer's convolution and gates), so the fit keeps one time per layer for each
signature with enough rows, and the engine's own for the others. An entry may also hold
`api_offset_ms`: what the TTFT of that signature's models leaves above the engine's fixed API
overhead (its first step's setup that no table times: MLA's on TensorRT-LLM +59 ms, gpt-oss's
sliding-window layers there -47 ms in the fit of 2026-12-04)."""


def layer_signature(model: Any) -> str:
    """The sorted attention kinds of a model's decoder layers, joined by '+' (e.g. 'mla',
    'gqa+linear')."""
    return "+".join(sorted({kind for kind, _ in model.layer_kinds}))


CPU_PRESETS = ("cpu",)
"""Hardware presets that keep the cost model's own per-step overhead: the fitted step parts
(a time per decoder layer of GPU kernels no table prices) come from GPU systems' rows and say
nothing of a CPU engine's steps, which `rackplan calibrate` and the closed loop measure."""


DISAGGREGATED = "disaggregated"
"""The key of an engine entry's sub-entry measured or fitted on P/D deployments: its latencies
are preferred for P/D plans; what it leaves out comes from the entry. In a calibration folder
(one's own engine): on a small host the decode engine's API server may share its core, so P/D
steps cost more than aggregated ones. In the shipped fit: the per-request step overhead fitted
on the P/D rows, whose decode steps carry no prompts (aggregated rows' slope also stands for
prompt work that mixed steps do and the tables do not price; docs/accuracy.md)."""


def serving_overhead(engine: str, disaggregated: bool, hardware: str | None = None,
                     layers: str | None = None) -> ServingOverhead:
    """The fitted overhead of an engine (zeros where nothing was fitted); with the fixed API
    overhead fitted on `hardware`'s own rows where there were enough (HARDWARE_KEY), and the
    per-layer step overhead and the fixed API overhead's offset fitted on models of the layer
    signature `layers` where there were enough (LAYERS_KEY; the API overhead floored at 0); for
    a P/D plan (`disaggregated`) with the per-request step overhead of the P/D rows where the
    fit has one (DISAGGREGATED); on a CPU preset (CPU_PRESETS) without the fitted step parts."""
    fitted = _table().get("engines", {}).get(engine, {})
    on = fitted.get(HARDWARE_KEY, {}).get(hardware, {}) if hardware else {}
    kind = fitted.get(LAYERS_KEY, {}).get(layers, {}) if layers else {}
    gpu = hardware not in CPU_PRESETS
    step = fitted.get("step_overhead_ms") if gpu else None
    per_seq = fitted.get("step_overhead_per_seq_ms", 0.0)
    if disaggregated:  # a P/D plan's steps: the slope its own rows give, where they gave one
        per_seq = fitted.get(DISAGGREGATED, {}).get("step_overhead_per_seq_ms", per_seq)
    per_layer = kind.get("step_overhead_per_layer_ms",
                         fitted.get("step_overhead_per_layer_ms", 0.0))
    api = float(on.get("api_overhead_ms", fitted.get("api_overhead_ms", 0.0)))
    return ServingOverhead(
        api_overhead_ms=max(0.0, api + float(kind.get("api_offset_ms", 0.0))),
        api_per_ktoken_ms=float(fitted.get("api_per_ktoken_ms", 0.0)),
        step_overhead_ms=None if step is None else float(step),
        step_overhead_per_layer_ms=float(per_layer) if gpu else 0.0,
        step_overhead_per_seq_ms=float(per_seq) if gpu else 0.0,
        handoff_ms=float(fitted.get("handoff_ms", 0.0)) if disaggregated else 0.0)


def fitted_overhead(deployment: Any) -> ServingOverhead:
    """The latencies fitted on published measurements for a deployment's engine, hardware
    and model's decoder layers (`serving_overhead` with its layer signature)."""
    from simulator.specs.hardware import load_hardware
    from simulator.specs.model import load_model

    return serving_overhead(deployment.engine, deployment.disaggregated,
                            load_hardware(deployment.hardware).name,
                            layer_signature(load_model(deployment.model)))


USER_FILE = "serving_overhead.json"
"""Serving latencies measured on a real engine, in a `rackplan calibrate` folder beside the
kernel tables (benchmarks/closed_loop.py fits and writes them). While that folder is the active
calibration they are preferred to the shipped fit for the hardware and engine they name."""
USER_FORMAT = 1
FIELDS = ("api_overhead_ms", "step_overhead_ms", "handoff_ms", "step_overhead_per_seq_ms",
          "api_serial_ms", "api_per_ktoken_ms", "step_overhead_per_layer_ms")


def _user_entry(folder: Path, hardware: str, engine: str) -> dict[str, Any] | None:
    path = folder / USER_FILE
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    data = _read_user(str(path), stat.st_mtime_ns)
    entry = data.get("hardware", {}).get(hardware, {}).get(engine)
    return entry if isinstance(entry, dict) else None


@cache
def _read_user(path: str, mtime_ns: int) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path} is not readable JSON ({exc}); delete it or fit it again "
                        "with benchmarks/closed_loop.py") from None
    if not isinstance(data, dict) or data.get("format") != USER_FORMAT:
        got = data.get("format") if isinstance(data, dict) else None
        raise SpecError(f"{path} has format {got!r}, expected {USER_FORMAT}; fit it again "
                        "with benchmarks/closed_loop.py")
    return data


def user_serving_overhead(folder: Path, hardware: str, engine: str, disaggregated: bool,
                          fallback: ServingOverhead | None = None) -> ServingOverhead | None:
    """The latencies measured for `hardware` and `engine` in a calibration folder, or None when
    its serving_overhead.json has no entry for them. A latency the entry leaves out comes from
    `fallback` (the shipped fit); only P/D pays the handoff. A measured API overhead without
    its own time per prompt token holds that time at the prompt length it was measured at, so
    it comes without the fallback's; a measured step overhead without its own part per layer
    holds the layers' part too, so it comes without the fallback's."""
    entry = _user_entry(folder, hardware, engine)
    if entry is None:
        return None
    base = fallback or ServingOverhead()
    pd = entry.get(DISAGGREGATED) if disaggregated else None
    got = {k: entry.get(k) for k in FIELDS}
    if isinstance(pd, dict):
        got.update({k: pd[k] for k in FIELDS if pd.get(k) is not None})
    step = got["step_overhead_ms"]
    per_layer = got["step_overhead_per_layer_ms"]
    if per_layer is None:
        per_layer = base.step_overhead_per_layer_ms if step is None else 0.0
    per_ktoken = got["api_per_ktoken_ms"]
    if per_ktoken is None:
        per_ktoken = base.api_per_ktoken_ms if got["api_overhead_ms"] is None else 0.0
    return ServingOverhead(
        api_overhead_ms=base.api_overhead_ms if got["api_overhead_ms"] is None
        else float(got["api_overhead_ms"]),
        api_per_ktoken_ms=float(per_ktoken),
        step_overhead_ms=base.step_overhead_ms if step is None else float(step),
        step_overhead_per_layer_ms=float(per_layer),
        handoff_ms=0.0 if not disaggregated else (
            base.handoff_ms if got["handoff_ms"] is None else float(got["handoff_ms"])),
        step_overhead_per_seq_ms=float(got["step_overhead_per_seq_ms"] or 0.0),
        api_serial_ms=float(got["api_serial_ms"] or 0.0))


def write_user_serving_overhead(folder: Path, hardware: str, engine: str,
                                latencies: Mapping[str, float | None],
                                about: Mapping[str, Any], disaggregated: bool = False) -> Path:
    """Update the measured latencies (keys of FIELDS; None removes one) of one hardware and
    engine in the folder's serving_overhead.json, keeping everything else; `about` says how
    they were measured. `disaggregated`: measured on a P/D deployment, into the entry's
    DISAGGREGATED sub-entry. Written to a temporary file, then renamed."""
    bad = sorted(set(latencies) - set(FIELDS))
    if bad:
        raise SpecError(f"unknown serving latency {bad[0]!r}; valid: {', '.join(FIELDS)}")
    if not folder.is_dir():
        raise SpecError(f"{folder} is not a folder; give one written by `rackplan calibrate`")
    path = folder / USER_FILE
    data: dict[str, Any] = {"format": USER_FORMAT, "hardware": {}}
    if path.exists():
        data = dict(_read_user(str(path), path.stat().st_mtime_ns))
    hardware_entries = dict(data.get("hardware", {}))
    engines = dict(hardware_entries.get(hardware, {}))
    entry = dict(engines.get(engine, {}))
    target = dict(entry.get(DISAGGREGATED, {})) if disaggregated else entry
    target.update(about)
    for k, v in latencies.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = round(float(v), 4)
    if disaggregated:
        entry[DISAGGREGATED] = target
    engines[engine] = entry
    hardware_entries[hardware] = engines
    data = {**data, "hardware": hardware_entries}
    fd, tmp = tempfile.mkstemp(prefix=f".{USER_FILE}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
