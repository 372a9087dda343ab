"""One calibration run: check every kernel against its reference, sweep a model's shapes, write
the tables.

Checks all run before any timing, so a wrong kernel fails the run before it costs sweep time
and before a table could be written from it.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from kernels import attention, comm, gemm, memory, mla, moe
from kernels.device import Device, detect
from kernels.shapes import OPS, build_sweep
from kernels.timing import Timer, timer_for
from kernels.writer import check_destination, write_calibration
from simulator.specs.model import load_model

ENGINE = "vllm"
"""Engine folder the tables go under (the calibration layer falls back to it for any engine)."""
VERSION = "measured"
"""Version folder: these are our own kernels' timings, not one engine release's."""

Tick = Callable[[], bool]
"""Called after each measured shape; False when the time budget is spent (stop sweeping)."""


@dataclass(frozen=True)
class Bench:
    """One family of kernels: its check against a reference, and its sweep."""

    check: Callable[[Device], None] | None
    """None: the family checks itself inside `run`, before timing (collectives, in the ranks)."""
    run: Callable[[list[Any], Device, Timer, Tick], list[dict[str, Any]]]


BENCHES: dict[str, Bench] = {
    "gemm": Bench(gemm.check, gemm.run),
    "moe": Bench(moe.check, moe.run),
    "attention": Bench(attention.check, attention.run),
    "mla": Bench(mla.check, mla.run),
    "memory": Bench(memory.check, memory.run),
    "comm": Bench(None, comm.run),
}

TABLE_OF = {"gemm": "gemm", "moe": "moe", "generation_attention": "attention_generation",
            "context_attention": "attention_context",
            "mla_generation_module": "mla_generation", "mla_context_module": "mla_context",
            "copy": "memory", "all_gather": "nccl", "reduce_scatter": "nccl",
            "all_reduce": "nccl", "alltoall": "nccl"}
"""A row's op_name -> the calibration table it belongs to."""

Progress = Callable[[int, int, str], None]
"""(shapes done, shapes in all, what is running)."""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def calibrate(device: str, model: str, quick: bool, out: str | Path,
              ops: tuple[str, ...] = OPS, max_seconds: float | None = None,
              progress: Progress | None = None, threads: int | None = None) -> dict[str, Any]:
    """Measure `model`'s shapes on `device` and write the tables to `out`; returns the
    manifest. `threads`: torch intra-op threads (default: torch's, all cores it may use).
    SpecError for a bad device, model or destination; KernelMismatch when a kernel disagrees
    with its reference."""
    start = time.monotonic()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    dev = detect(device)
    spec = load_model(model)
    check_destination(Path(out))
    sweep = build_sweep(spec, dev.kind, quick, dev.fp8, ops, dev.ranks_for_comm(),
                        dev.memory_bytes)
    report = progress or (lambda done, total, label: None)
    checks = []
    seconds: dict[str, float] = {}
    for op in sweep.shapes:
        check = BENCHES[op].check
        if check is not None:
            report(0, sweep.total(), f"checking {op}")
            t0 = time.monotonic()
            check(dev)
            checks.append(op)
            seconds[f"check {op}"] = round(time.monotonic() - t0, 3)
    timer = timer_for(dev.kind, quick)
    done = 0
    unfinished: list[str] = []
    rows: dict[str, list[dict[str, Any]]] = {}
    common = {"framework": "rackplan", "version": _version("rackplan"), "device": dev.name}
    for op, shapes in sweep.shapes.items():
        if max_seconds is not None and time.monotonic() - start > max_seconds:
            unfinished.append(op)
            continue

        def tick(op: str = op) -> bool:
            nonlocal done
            done += 1
            report(done, sweep.total(), op)
            return max_seconds is None or time.monotonic() - start <= max_seconds

        report(done, sweep.total(), op)
        t0 = time.monotonic()
        measured = BENCHES[op].run(shapes, dev, timer, tick)
        seconds[op] = round(time.monotonic() - t0, 3)
        if len(measured) < len(shapes):
            unfinished.append(op)
        for row in measured:
            extra = ({"model": spec.name, "architecture": spec.architecture}
                     if op == "mla" else {})
            rows.setdefault(TABLE_OF[row["op_name"]], []).append({**common, **extra, **row})
    manifest = {
        "device": asdict(dev),
        "versions": {"torch": _version("torch"), "triton": _version("triton"),
                     "rackplan": _version("rackplan"), "python": platform.python_version()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": spec.name, "quick": quick, "engine": ENGINE, "version_folder": VERSION,
        "timer": repr(timer), "checks_passed": checks, "skipped": sweep.skipped,
        "unfinished": unfinished, "seconds": seconds, "rows": {t: len(r) for t, r in rows.items()},
        "summary": summarize(rows), "shapes": sweep.describe(),
    }
    manifest["wall_time_s"] = round(time.monotonic() - start, 3)
    manifest["tables"] = write_calibration(out, rows, manifest, ENGINE, VERSION)
    return manifest


def summarize(rows: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Headline figures: best GEMM TFLOP/s per dtype, best copy bandwidth, and so on."""
    out: dict[str, float] = {}
    for r in rows.get("gemm", []):
        key = f"gemm_{r['gemm_dtype']}_tflops_best"
        tflops = 2 * r["m"] * r["n"] * r["k"] / (r["latency"] * 1e-3) / 1e12
        out[key] = max(out.get(key, 0.0), round(tflops, 4))
    for r in rows.get("memory", []):
        out["copy_gb_s_best"] = max(out.get("copy_gb_s_best", 0.0),
                                    round(r["bandwidth_gb_s"], 2))
    for table in ("moe", "attention_generation", "attention_context", "mla_generation",
                  "mla_context", "nccl"):
        if rows.get(table):
            lat = [r["latency"] for r in rows[table]]
            out[f"{table}_ms_min"] = round(min(lat), 5)
            out[f"{table}_ms_max"] = round(max(lat), 5)
    return out
