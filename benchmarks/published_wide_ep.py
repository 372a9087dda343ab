"""Published wide-EP throughput (DeepSeek-V3/R1 served with expert parallelism across GPUs)
beside rackplan's step prices for the same steps: SGLang's 96-H100 deployment (prefill EP32,
decode EP72, DeepEP, two-batch overlap, EPLB) and vLLM's GB200 one (prefill DEP2 with weight
offloading, decode DEP8, NVFP4 experts).

The figures, their conditions and what is assumed where a report is silent:
benchmarks/data/published_wide_ep.csv and .md. Each line prices one saturated step of the
published server with `rackplan step`, from a single-role deck written beside the run (the
reports measure prefill and decode apart), and compares tokens/s per GPU: prompt tokens for
prefill, generated tokens for decode. rackplan's step spreads each step's tokens over the
experts as an ideal EPLB would, so it is closest in kind to SGLang's "simulated perfect EPLB"
line.

Run: .venv/bin/python benchmarks/published_wide_ep.py [--json]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.stepcalc import step_report  # noqa: E402

DATA = ROOT / "benchmarks/data/published_wide_ep.csv"
PER = {"GPU": 1, "node of 8": 8}
"""GPUs a published figure is counted over."""
PREFILL_TOKENS = 16384
"""A prefill server's token budget a step when its row asks for less (the SGLang blog's 16,384
tokens a GPU)."""


def deck(row: dict[str, str]) -> dict[str, Any]:
    """The published server of `row` as a single-role rackplan deployment."""
    role, batch = row["role"], int(row["batch_per_rank"])
    spec: dict[str, Any] = {"instances": 1, "dep": int(row["dep"]),
                            "all2all_backend": row["all2all"], "dbo": row["dbo"] == "true",
                            "redundant_experts": int(row["redundant_experts"])}
    if role == "prefill":
        spec["max_num_batched_tokens"] = max(PREFILL_TOKENS, batch * int(row["context"]))
    else:
        spec["max_num_seqs"] = batch
    if float(row["offload_gb"]) > 0:
        spec.update(cpu_offload_gb=float(row["offload_gb"]), offload_backend="prefetch")
    return {"model": row["model"], "hardware": row["hardware"], "engine": row["engine"],
            "precision": {"weights": row["weights"], "kv_cache": row["kv_cache"]}, role: spec}


def line(number: int, row: dict[str, str], folder: Path) -> dict[str, Any]:
    if row["per"] not in PER:
        raise SystemExit(f"{DATA}: {row['figure']!r} counts per {row['per']!r}; "
                         f"valid: {', '.join(PER)}")
    role, batch, context = row["role"], int(row["batch_per_rank"]), int(row["context"])
    path = folder / f"{number:02d}-{row['source']}-{role}.yaml"
    path.write_text(yaml.safe_dump(deck(row), sort_keys=False))
    rep = step_report(path, role, batch, context)
    published = float(row["published"]) / PER[row["per"]]
    predicted = float(rep["tokens_per_s_per_gpu"])
    return {"source": row["source"], "figure": row["figure"], "layout": rep["layout"],
            "published_tok_s_gpu": published, "rackplan_tok_s_gpu": predicted,
            "error": predicted / published - 1, "step_ms": rep["total_ms"],
            "breakdown_ms": rep["breakdown_ms"],
            "overlap": rep["provenance"].get("dbo", "none"), "note": row["note"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rackplan-published-") as tmp:
        lines = [line(i, row, Path(tmp))
                 for i, row in enumerate(csv.DictReader(DATA.open()))]
    mean = sum(abs(x["error"]) for x in lines) / len(lines)
    if args.json:
        print(json.dumps({"lines": lines, "mean_abs_error": mean}, indent=1))
        return 0
    print(f"{'source':<12}{'figure':<46}{'layout':<7}{'published':>10}{'rackplan':>10}"
          f"{'error':>8}  step ms (attention / moe / exposed exchange)")
    for x in lines:
        b = x["breakdown_ms"]
        note = f"  [{x['note']}]" if x["note"] else ""
        print(f"{x['source']:<12}{x['figure']:<46}{x['layout']:<7}"
              f"{x['published_tok_s_gpu']:>10,.0f}{x['rackplan_tok_s_gpu']:>10,.0f}"
              f"{x['error']:>+8.0%}  {x['step_ms']:.1f} ({b['attention']:.1f} / "
              f"{b['moe']:.1f} / {b['communication']:.1f}){note}")
    print(f"tokens/s per GPU; mean absolute error {mean:.0%} over {len(lines)} figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
