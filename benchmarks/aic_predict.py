"""aiconfigurator's own TTFT/TPOT predictions for the measured rows of silicon_sample.csv.

Runs in its own environment, never in rackplan's .venv:
    python3.11 -m venv .venv-aic && .venv-aic/bin/pip install aiconfigurator==0.12.0
    .venv-aic/bin/python benchmarks/aic_predict.py [--systems h100_sxm,h200_sxm] [--all-models]

Each row of aiconfigurator-core's `systems/silicon_sample.csv` is handed, as recorded, to
aiconfigurator's public single-point estimator `aiconfigurator.cli.api.cli_estimate` (the
Python form of `aiconfigurator cli estimate`), SILICON database mode, the backend's newest
database on that system. Aggregated rows pass their batch_size and parallel layout; P/D rows
pass both roles' layouts and worker counts, with the decode batch the row's concurrency spread
over its decode workers when batch sizes are not recorded (prefill batch 1). Rows it cannot
represent (P/D without worker counts, a model or layout aiconfigurator rejects) are written with
the reason. By default only the MoE rows of H100 and H200 are asked (the comparison this feeds;
its 1,071 rows took 936 s on one core, so all 5,221 would take over an hour). H100/H200 rows
whose tp_size records TP x EP (ids "tp8_ep8" with tp_size 64) are passed as recorded, and
aiconfigurator rejects them.

Writes benchmarks/data/aic_predictions.csv (id, aic_ttft_ms, aic_tpot_ms, aic_backend_version,
reason) atomically and benchmarks/data/aic_predictions.md (command, versions, date). Progress on
stderr about every 10 s. benchmarks/compare_aic.py reads the CSV from rackplan's .venv.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import io
import logging
import math
import os
import sys
import time
from importlib import metadata, resources
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "data" / "aic_predictions.csv"
COLUMNS = ("id", "aic_ttft_ms", "aic_tpot_ms", "aic_backend_version", "reason")
DEFAULT_SYSTEMS = "h100_sxm,h200_sxm"


def _int(v: Any) -> int | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return int(v)


def _concurrency(row: dict[str, Any]) -> int | None:
    note = str(row.get("silicon_data_source") or "")
    for part in note.split(";"):
        key, _, val = part.strip().partition("=")
        if key == "silicon_concurrency" and val.isdigit():
            return int(val)
    return _int(row.get("batch_size"))


def estimate_args(row: dict[str, Any]) -> dict[str, Any]:
    """cli_estimate's keyword arguments for one row; ValueError says why it cannot be asked."""
    kw: dict[str, Any] = {
        "mode": row["mode"], "backend_name": row["backend"], "isl": int(row["isl"]),
        "osl": int(row["osl"]), "database_mode": "SILICON"}
    for q in ("gemm_quant_mode", "moe_quant_mode"):
        if isinstance(row.get(q), str) and row[q]:
            kw[q] = row[q]
    conc = _concurrency(row)
    if row["mode"] == "agg":
        batch = _int(row.get("batch_size")) or conc
        if not batch:
            raise ValueError("batch size not recorded")
        kw["batch_size"] = batch
        for k in ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size"):
            v = _int(row.get(k))
            if v is not None:
                kw[k] = v
        return kw
    pw, dw = _int(row.get("prefill_num_workers")), _int(row.get("decode_num_workers"))
    if not pw or not dw:
        raise ValueError("P/D worker counts not recorded")
    for role in ("prefill", "decode"):
        for k in ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size"):
            v = _int(row.get(f"{role}_{k}"))
            if v is not None:
                kw[f"{role}_{k}"] = v
    kw["prefill_num_workers"], kw["decode_num_workers"] = pw, dw
    kw["prefill_batch_size"] = _int(row.get("prefill_batch_size")) or 1
    dbatch = _int(row.get("decode_batch_size"))
    if not dbatch:
        if not conc:
            raise ValueError("concurrency not recorded")
        dbatch = math.ceil(conc / dw)
    kw["decode_batch_size"] = dbatch
    return kw


def predict(row: dict[str, Any]) -> dict[str, Any]:
    from aiconfigurator.cli.api import cli_estimate

    rec: dict[str, Any] = {"id": row["id"], "aic_ttft_ms": "", "aic_tpot_ms": "",
                           "aic_backend_version": "", "reason": ""}
    try:
        kw = estimate_args(row)
        with contextlib.redirect_stdout(io.StringIO()):
            res = cli_estimate(row["model_path"], row["system"], **kw)
        if not (math.isfinite(res.ttft) and math.isfinite(res.tpot)) or res.tpot <= 0:
            raise ValueError(f"no finite estimate (ttft {res.ttft}, tpot {res.tpot})")
        rec.update(aic_ttft_ms=f"{res.ttft:.6g}", aic_tpot_ms=f"{res.tpot:.6g}",
                   aic_backend_version=res.backend_version)
    except Exception as e:  # aiconfigurator raises many kinds; each is this row's reason
        core = str(resources.files("aiconfigurator_core"))  # no machine paths in the reason
        msg = " ".join(str(e).replace(core, "aiconfigurator_core").split())[:200]
        rec["reason"] = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default=DEFAULT_SYSTEMS,
                   help=f"comma list of systems to ask about (default {DEFAULT_SYSTEMS}; 'all')")
    p.add_argument("--all-models", action="store_true", help="dense models too (default MoE)")
    p.add_argument("--limit", type=int, default=0, help="first N selected rows only (a smoke run)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)

    import pandas as pd
    from aiconfigurator.sdk.models import check_is_moe

    logging.disable(logging.WARNING)  # aiconfigurator logs each table fallback
    src = Path(str(resources.files("aiconfigurator_core"))) / "systems" / "silicon_sample.csv"
    df = pd.read_csv(src)
    if args.systems != "all":
        df = df[df.system.isin(args.systems.split(","))]
    if not args.all_models:
        moe = {}
        for m in df.model_path.unique():
            try:
                moe[m] = bool(check_is_moe(m))
            except Exception:
                moe[m] = False
        df = df[df.model_path.map(moe)]
    rows = df.to_dict(orient="records")
    if args.limit:
        rows = rows[:args.limit]

    out: list[dict[str, Any]] = []
    start = last = time.monotonic()
    for i, row in enumerate(rows, 1):
        out.append(predict(row))
        now = time.monotonic()
        if now - last >= 10 or i == len(rows):
            ok = sum(1 for r in out if not r["reason"])
            print(f"{i}/{len(rows)} rows, {ok} predicted, {now - start:.0f} s", file=sys.stderr)
            last = now

    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(out)
    os.replace(tmp, args.out)

    ok = sum(1 for r in out if not r["reason"])
    reasons: dict[str, int] = {}
    for r in out:
        if r["reason"]:
            key = r["reason"].split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
    cmd = "python benchmarks/aic_predict.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    md = [f"# {args.out.name}", "",
          "aiconfigurator's own TTFT/TPOT estimates (`aiconfigurator.cli.api.cli_estimate`, "
          "SILICON database mode, newest database per backend) for the rows of "
          "aiconfigurator-core's `systems/silicon_sample.csv`; read by "
          "`benchmarks/compare_aic.py`.", "",
          f"- command: `.venv-aic/bin/{cmd}`",
          f"- aiconfigurator {metadata.version('aiconfigurator')}, aiconfigurator-core "
          f"{metadata.version('aiconfigurator-core')}",
          f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
          f"- rows asked: {len(out)} (systems: {args.systems}; "
          f"{'all models' if args.all_models else 'MoE models only'}"
          f"{f'; first {args.limit}' if args.limit else ''}); predicted: {ok}; "
          f"wall time {time.monotonic() - start:.0f} s",
          "- not predicted, by reason: " + (", ".join(
              f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])) or "none"),
          ""]
    if args.out == OUT:
        md_path = args.out.with_suffix(".md")
        tmp_md = md_path.with_name(md_path.name + ".tmp")
        tmp_md.write_text("\n".join(md))
        os.replace(tmp_md, md_path)
    print(f"wrote {args.out}: {ok}/{len(out)} rows predicted", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
