#!/usr/bin/env bash
# GPU check of kernels/ on one H200, at most 8 minutes: the Triton kernels against their torch
# references, then sweeps of DeepSeek-V3's shapes (GEMM bf16 + fp8, our fused MoE, MLA decode
# and prefill, copy bandwidth) and of a GQA model's attention (Qwen3-235B-A22B's heads; decode
# through our paged Triton kernel), each printed beside aiconfigurator-core's H200 table for the
# same shapes.
#
# Usage: benchmarks/device_check.sh [OUT_DIR]   (default: $OUT, else runs/device-check)
#   PYTHON=...  the interpreter (default: .venv/bin/python when it has CUDA torch, else python3)
#
# Without a visible NVIDIA GPU it stops at once, installing nothing. With one it uses what is
# installed; when torch (CUDA build) or triton is missing it tries
# `pip install torch==2.13.0 triton` once and stops with a clear message if that fails (the
# machine may have no network); the project's own dependencies likewise. Each family runs as its
# own `rackplan calibrate` with a wall-time budget (--max-seconds), so a slow one cannot starve
# the others; what a budget cut off is listed under "unfinished" in that manifest.
set -euo pipefail

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "device_check: no NVIDIA GPU visible (nvidia-smi -L failed); run it on a GPU machine" >&2
    exit 2
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEST="${1:-${OUT:-$ROOT/runs/device-check}}"
mkdir -p "$DEST"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

CUDA_TORCH="import torch, triton; assert torch.cuda.is_available()"
PROJECT_DEPS="import numpy, pandas, pyarrow, pydantic, rich, scipy, yaml, networkx, aiconfigurator_core"

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
    PY=python3
    if [[ -x .venv/bin/python ]] && .venv/bin/python -c "$CUDA_TORCH" >/dev/null 2>&1; then
        PY=.venv/bin/python
    fi
fi
has() { "$PY" -c "$1" >/dev/null 2>&1; }

if ! has "$CUDA_TORCH"; then
    echo "device_check: $PY lacks CUDA torch or triton; trying pip install torch==2.13.0 triton" >&2
    "$PY" -m pip install --quiet torch==2.13.0 triton >&2 || true
    if ! has "$CUDA_TORCH"; then
        echo "device_check: needs torch==2.13.0 (CUDA build) and triton importable by $PY with a" \
             "visible GPU; install them (pip could not) or set PYTHON=" >&2
        exit 2
    fi
fi
if ! has "$PROJECT_DEPS"; then
    echo "device_check: installing the project's dependencies (pip install -e .)" >&2
    "$PY" -m pip install --quiet -e . >&2 || true
    if ! has "$PROJECT_DEPS"; then
        echo "device_check: needs numpy, pandas, pyarrow, pydantic, rich, scipy, pyyaml," \
             "networkx and aiconfigurator-core==0.12.0 importable by $PY; pip install -e ." \
             "failed (no network?)" >&2
        exit 2
    fi
fi

"$PY" -c "import torch, triton; print('device_check: torch', torch.__version__, 'triton',
triton.__version__, 'on', torch.cuda.get_device_name(0))"
start=$SECONDS

# name | model | families | sweep budget (s). Each run adds ~15 s of start-up; timeouts guard against hangs.
calibrate() {
    timeout $(($4 + 40)) "$PY" -m planner.cli calibrate --device cuda --model "$2" --only "$3" \
        --max-seconds "$4" --out "$DEST/$1" --json > "$DEST/$1.json"
    "$PY" -c "import json, sys; m = json.load(open(sys.argv[1])); print(sys.argv[2], m['rows'],
'unfinished:', m['unfinished'], m['seconds'], m['summary'])" "$DEST/$1.json" "$1"
    rm -f "$DEST/$1.json"
}
calibrate dsv3-gemm deepseek-v3 gemm,memory 75
calibrate dsv3-moe deepseek-v3 moe 90
calibrate dsv3-mla deepseek-v3 mla 60
calibrate qwen3-attn qwen3-235b-a22b attention 50

"$PY" benchmarks/compare_tables.py "$DEST/dsv3-gemm" "$DEST/dsv3-moe" "$DEST/dsv3-mla" \
    "$DEST/qwen3-attn" --hardware h200 --limit 20 --csv "$DEST/compare-h200.csv"
echo "device_check: done in $((SECONDS - start)) s; manifests and compare-h200.csv in $DEST"
