"""SGLang's published wide-EP throughput (DeepSeek-V3 on 96 H100: prefill EP32, decode EP72,
DeepEP, two-batch overlap, EPLB) beside rackplan's step prices for the same steps.

The figures and their conditions: benchmarks/data/published_wide_ep.csv and .md (the LMSYS
blog of 2025-05-05). Each line prices one saturated step of the published server with
`rackplan step`, from a single-role deck written beside the run (the blog measured prefill and
decode apart): SGLang, FP8 weights, BF16 KV, 32 redundant experts, DeepEP normal kernels for
prefill and low-latency ones for decode, two-batch overlap as the line says. It compares
tokens/s per GPU: prompt tokens for prefill, generated tokens for decode. rackplan's step
spreads each step's tokens over the experts as an ideal EPLB would, so it is closest in kind
to the "simulated perfect EPLB" line.

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
GPUS_PER_NODE = 8
REDUNDANT = 32
"""The blog's EPLB: 32 redundant experts (288 slots) on both roles."""
BACKENDS = {"prefill": "deepep_high_throughput", "decode": "deepep_low_latency"}


def deck(role: str, ep: int, batch: int, dbo: bool) -> dict[str, Any]:
    """One published server as a single-role rackplan deployment (the blog measured prefill
    and decode apart)."""
    limit = {"max_num_batched_tokens": 16384} if role == "prefill" else {"max_num_seqs": batch}
    return {"model": "deepseek-v3", "hardware": "h100", "engine": "sglang",
            "precision": {"weights": "fp8", "kv_cache": "bf16"},
            role: {"instances": 1, "dep": ep, "all2all_backend": BACKENDS[role], "dbo": dbo,
                   "redundant_experts": REDUNDANT, **limit}}


def line(row: dict[str, str], folder: Path) -> dict[str, Any]:
    role, ep, batch = row["role"], int(row["ep"]), int(row["batch_per_rank"])
    context, dbo = int(row["context"]), row["dbo"] == "true"
    path = folder / f"sglang-h100-{role}-ep{ep}-{'dbo' if dbo else 'plain'}.yaml"
    path.write_text(yaml.safe_dump(deck(role, ep, batch, dbo), sort_keys=False))
    rep = step_report(path, role, batch, context)
    published = float(row["tok_s_per_node"]) / GPUS_PER_NODE
    predicted = float(rep["tokens_per_s_per_gpu"])
    return {"figure": row["figure"], "experts": row["experts"], "layout": rep["layout"],
            "dbo": dbo, "published_tok_s_gpu": published, "rackplan_tok_s_gpu": predicted,
            "error": predicted / published - 1, "step_ms": rep["total_ms"],
            "breakdown_ms": rep["breakdown_ms"],
            "overlap": rep["provenance"].get("dbo", "none"), "derived": row["derived"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rackplan-published-") as tmp:
        lines = [line(row, Path(tmp)) for row in csv.DictReader(DATA.open())]
    mean = sum(abs(x["error"]) for x in lines) / len(lines)
    if args.json:
        print(json.dumps({"lines": lines, "mean_abs_error": mean}, indent=1))
        return 0
    print(f"{'figure':<44}{'experts':<24}{'published':>10}{'rackplan':>10}{'error':>8}"
          "  step ms (attention / moe / exposed exchange)")
    for x in lines:
        b = x["breakdown_ms"]
        note = f"  [{x['derived']}]" if x["derived"] else ""
        print(f"{x['figure']:<44}{x['experts']:<24}{x['published_tok_s_gpu']:>10,.0f}"
              f"{x['rackplan_tok_s_gpu']:>10,.0f}{x['error']:>+8.0%}  {x['step_ms']:.1f} "
              f"({b['attention']:.1f} / {b['moe']:.1f} / {b['communication']:.1f}){note}")
    print(f"tokens/s per GPU; mean absolute error {mean:.0%} over {len(lines)} figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
