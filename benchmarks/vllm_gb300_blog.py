"""vLLM's "DeepSeek-V3.2 on GB300: Performance Breakthrough" (the DaoCloud and vLLM team, vLLM
blog, 2026-02-13, blog.vllm.ai/2026/02/13/gb300-deepseek.html) beside rackplan's predictions:
one line per published figure, with the relative error and the `rackplan simulate` command.

The blog serves DeepSeek-R1-0528 and DeepSeek-V3.2 with NVFP4 weights on two GB300 GPUs
(vLLM v0.14.1), aggregated (no P/D): `-tp 2`, or `-dp 2 --enable-expert-parallel` (EP2), with
`--max-num-batched-tokens` 32768 (R1) or 20480 (V3.2), and measures with `vllm bench serve`
(random dataset, 1,000 prompts, `--ignore-eos`) at a fixed `--max-concurrency`: prefill-only
(2,048 prompt tokens, 1 output token; total tokens/s per GPU) and mixed (2,048 in, 1,024 or 64
out; output tokens/s per GPU). Where it is silent, this assumes: fp8 KV (the blog names no KV
dtype), vLLM's default 1,024 running requests, EP2's token budget the same as TP2's, its
default all-to-all for aggregated EP (allgather_reducescatter), no MTP; a mixed figure is the
peak over the concurrencies 64-1,024 (the blog gives no concurrency).

Ratios (EP2 / TP2, R1 / V3.2, GB300 / B300) compare two of rackplan's own runs, as the blog
compares two of its own; a published range counts as met anywhere inside it.

The blog's engine is older than every table rackplan prices from (vLLM 0.22-0.27 in
aiconfigurator-core 0.12.0), and vLLM's kernels moved between those versions: GB300's MLA
prefill module, measured at 0.24.0 and at 0.27.0 for the same shapes, is 0.61x as slow at 0.27
over 16K-65K tokens a step (median; `--drift` prints it). Absolute lines carry that drift;
ratios mostly cancel it.

Run: .venv/bin/python benchmarks/vllm_gb300_blog.py [--json] [--drift] [--decks DIR]
(--decks writes the deployments and workloads the printed commands name into DIR.)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.specs.deployment import Deployment  # noqa: E402
from simulator.specs.workload import Workload  # noqa: E402

PROMPTS = 1000
"""The blog's `--num-prompts`."""
ISL = 2048
MIXED_LOADS = (64, 128, 256, 512, 1024)
"""Concurrencies a mixed figure's peak is taken over (the blog gives none)."""
SHORT_LOADS = (32, 128, 512)
"""Concurrencies of the TP2-against-EP2 comparison at 64 output tokens."""


@dataclass(frozen=True)
class Server:
    """One of the blog's two-GPU servers."""

    name: str
    model: str
    layout: tuple[tuple[str, int], ...]
    """The aggregated role's parallel layout, (key, value) pairs."""
    budget: int
    """--max-num-batched-tokens."""
    hardware: str = "gb300"

    def spec(self) -> dict[str, Any]:
        return {"model": self.model, "hardware": self.hardware, "engine": "vllm",
                "precision": {"weights": "fp4", "kv_cache": "fp8"},
                "aggregated": {"instances": 1, **dict(self.layout), "max_num_seqs": 1024,
                               "max_num_batched_tokens": self.budget}}


R1_EP2 = Server("r1-ep2", "deepseek-r1", (("dep", 2),), 32768)
R1_TP2 = Server("r1-tp2", "deepseek-r1", (("tp", 2),), 32768)
V32_TP2 = Server("v32-tp2", "deepseek-v3.2", (("tp", 2),), 20480)
R1_TP2_B300 = Server("r1-tp2-b300", "deepseek-r1", (("tp", 2),), 32768, "b300")


def _workload(concurrency: int, output: int) -> dict[str, Any]:
    return {"arrival": {"kind": "closed", "concurrency": concurrency}, "requests": PROMPTS,
            "input_tokens": {"kind": "fixed", "value": ISL},
            "output_tokens": {"kind": "fixed", "value": output}, "seed": 0}


@cache
def run(server: Server, concurrency: int, output: int) -> dict[str, Any]:
    """`rackplan simulate` of the server under the blog's bench at this load (serving
    latencies in)."""
    from planner.evaluate import sim_options
    from simulator.des import simulate

    print(f"  simulating {server.name} at concurrency {concurrency}, {ISL} in / {output} out",
          file=sys.stderr, flush=True)
    d = Deployment.model_validate(server.spec())
    m = simulate(d, Workload.model_validate(_workload(concurrency, output)),
                 options=sim_options(d)).metrics()
    return {"total": m["throughput_tok_s_gpu"], "output": m["output_tok_s_gpu"],
            "ttft": m["ttft_ms"]["p50"], "tpot": m["tpot_ms"]["p50"]}


def prefill(server: Server, concurrency: int) -> float:
    return float(run(server, concurrency, 1)["total"])


def peak_output(server: Server) -> float:
    return max(float(run(server, c, 1024)["output"]) for c in MIXED_LOADS)


def peak_at(server: Server) -> str:
    """Where the mixed peak sits, and the TPOT there."""
    c = max(MIXED_LOADS, key=lambda c: float(run(server, c, 1024)["output"]))
    return f"rackplan's peak at c={c}, TPOT p50 {run(server, c, 1024)['tpot']:.1f} ms"


def short_ratios(key: str) -> list[float]:
    """TP2 / EP2 of R1 at 64 output tokens, at each of SHORT_LOADS."""
    return [float(run(R1_TP2, c, 64)[key]) / float(run(R1_EP2, c, 64)[key])
            for c in SHORT_LOADS]


@dataclass(frozen=True)
class Figure:
    name: str
    published: tuple[float, float]
    """The published value, or the range a ratio is given as (equal ends for one value)."""
    predict: Callable[[], float | list[float]]
    command: str
    note: str = ""
    detail: Callable[[], str] | None = None
    """What the prediction rests on, printed after the note."""


WORKLOADS = {**{f"prefill-c{c}": (c, 1) for c in (64, 256)},
             **{f"mixed-c{c}": (c, 1024) for c in MIXED_LOADS},
             **{f"short-c{c}": (c, 64) for c in SHORT_LOADS}}
"""The workload files --decks writes: name -> (concurrency, output tokens)."""


def write_decks(folder: Path) -> None:
    """The servers' deployments and the benches' workloads as YAML files in `folder`."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    files = {f"{s.name}.yaml": s.spec() for s in (R1_EP2, R1_TP2, V32_TP2, R1_TP2_B300)}
    files.update({f"{name}.yaml": _workload(*how) for name, how in WORKLOADS.items()})
    for name, spec in files.items():
        tmp = folder / f".{name}.tmp"
        tmp.write_text(yaml.safe_dump(spec, sort_keys=False))
        tmp.replace(folder / name)


def _cmd(server: Server, what: str) -> str:
    return f"rackplan simulate {server.name}.yaml --workload {what}.yaml --json"


def _prefill_ratio(name: str, published: tuple[float, float], over: tuple[Server, int],
                   under: tuple[Server, int], note: str) -> Figure:
    """A figure of one prefill-only run (server, concurrency) over another's."""
    (a, ca), (b, cb) = over, under
    return Figure(name, published, lambda: prefill(a, ca) / prefill(b, cb),
                  f"{_cmd(a, f'prefill-c{ca}')}; {_cmd(b, f'prefill-c{cb}')}", note)


SHORT_CMD = f"{_cmd(R1_TP2, 'short-cN')}; {_cmd(R1_EP2, 'short-cN')}"
"""The runs of the TP2-against-EP2 figures at 64 output tokens."""


FIGURES = (
    Figure("R1 EP2 prefill-only, c=256: total tok/s/GPU", (22476, 22476),
           lambda: prefill(R1_EP2, 256), _cmd(R1_EP2, "prefill-c256"),
           "EP2's budget assumed TP2's 32,768"),
    _prefill_ratio("R1 EP2 / TP2 prefill-only ceiling (c=256)", (1.10, 1.15), (R1_EP2, 256),
                   (R1_TP2, 256), "the blog: EP2's peak ~10-15 % above TP2's"),
    Figure("V3.2 TP2 prefill-only, c=64: total tok/s/GPU", (7360, 7360),
           lambda: prefill(V32_TP2, 64), _cmd(V32_TP2, "prefill-c64")),
    _prefill_ratio("R1 EP2 / V3.2 TP2 prefill-only", (3.0, 3.0), (R1_EP2, 256), (V32_TP2, 64),
                   "the blog: R1's prefill ~3x V3.2's"),
    _prefill_ratio("GB300 / B300 prefill-only per GPU (R1 TP2, c=256)", (1.14, 1.14),
                   (R1_TP2, 256), (R1_TP2_B300, 256), "the blog's layout for it assumed TP2"),
    Figure("R1 EP2 mixed 2K/1K: peak output tok/s/GPU", (3072, 3072),
           lambda: peak_output(R1_EP2), _cmd(R1_EP2, "mixed-cN"),
           "peak over concurrency 64-1,024", lambda: peak_at(R1_EP2)),
    Figure("V3.2 TP2 mixed 2K/1K: peak output tok/s/GPU", (2816, 2816),
           lambda: peak_output(V32_TP2), _cmd(V32_TP2, "mixed-cN"),
           "peak over concurrency 64-1,024", lambda: peak_at(V32_TP2)),
    Figure("R1 TP2 / EP2 at 2K/64: TTFT", (0.5, 0.5), lambda: short_ratios("ttft"), SHORT_CMD,
           "the blog: TP2 improves TTFT by ~50 %; at c=32/128/512"),
    Figure("R1 TP2 / EP2 at 2K/64: output tok/s", (1.05, 1.20), lambda: short_ratios("output"),
           SHORT_CMD, "the blog: TP2 serves 5-20 % more; at c=32/128/512"),
    Figure("R1 TP2 / EP2 at 2K/64: TPOT", (1.5, 2.0), lambda: short_ratios("tpot"), SHORT_CMD,
           "the blog: TP2's TPOT 50 % to 2x worse; at c=32/128/512"),
)


def error(got: float, published: tuple[float, float]) -> float:
    """Relative distance from the published value or range (0 inside a range)."""
    lo, hi = published
    if got < lo:
        return (got - lo) / lo
    if got > hi:
        return (got - hi) / hi
    return 0.0


def drift() -> dict[str, float]:
    """GB300's vLLM MLA prefill module, 0.27.0 over 0.24.0, on the shapes both measured
    (fastest kernel each), by tokens a step: the median ratio."""
    import numpy as np
    import pandas as pd

    from simulator.calibration.tables import aic_system_dir

    base = aic_system_dir("gb300") / "mla" / "vllm"
    keys = ["mla_dtype", "kv_cache_dtype", "gemm_type", "num_heads", "batch_size", "isl",
            "tp_size"]
    frames = [pd.read_parquet(base / v / "mla_context_module_perf.parquet")
              .groupby(keys).latency.min() for v in ("0.24.0", "0.27.0")]
    both = pd.concat(frames, axis=1, keys=["old", "new"], join="inner").reset_index()
    tokens = both.batch_size * both.isl
    out = {}
    for lo, hi in ((1, 4096), (4096, 16384), (16384, 65536), (65536, 1 << 30)):
        sel = (tokens > lo) & (tokens <= hi)
        out[f"{lo}-{hi}" if hi < 1 << 30 else f"over {lo}"] = float(
            np.median(both.new[sel] / both.old[sel]))
    return out


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--drift", action="store_true",
                    help="print how GB300's MLA prefill module moved from vLLM 0.24 to 0.27")
    ap.add_argument("--decks", type=Path, metavar="DIR",
                    help="write the deployments and workloads the commands name into DIR")
    args = ap.parse_args()
    if args.decks is not None:
        if args.decks.exists() and not args.decks.is_dir():
            ap.error(f"--decks {args.decks} is a file; give a folder")
        write_decks(args.decks)
        print(f"wrote {len(WORKLOADS) + 4} files to {args.decks}", file=sys.stderr)
        return 0
    if args.drift:
        got = drift()
        print(json.dumps(got) if args.json else "\n".join(
            f"{k} tokens a step: 0.27.0 / 0.24.0 = {v:.2f}" for k, v in got.items()))
        return 0
    rows = []
    for f in FIGURES:
        got = f.predict()
        values = got if isinstance(got, list) else [got]
        errors = [error(v, f.published) for v in values]
        note = "; ".join(n for n in (f.note, f.detail() if f.detail else "") if n)
        rows.append({"figure": f.name, "published": list(f.published), "predicted": values,
                     "rel_error": errors, "command": f.command, "note": note})
    if args.json:
        print(json.dumps({"figures": rows}, indent=1))
        return 0
    for r in rows:
        lo, hi = r["published"]
        pub = _fmt(lo) if lo == hi else f"{_fmt(lo)}-{_fmt(hi)}"
        pred = " / ".join(_fmt(v) for v in r["predicted"])
        err = " / ".join("within" if e == 0 else f"{e:+.0%}" for e in r["rel_error"])
        print(f"{r['figure']}: published {pub}, rackplan {pred} ({err})"
              + (f"; {r['note']}" if r["note"] else ""))
        print(f"    {r['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
