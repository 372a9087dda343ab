"""The tiny-moe model the CPU engine serves: random weights and a tokenizer trained on the spot.

Nothing is downloaded. The model is a Qwen3-MoE built from the tiny-moe preset
(simulator/specs/presets/models/tiny-moe.json) with seeded random weights; the tokenizer is a
byte-level BPE trained on the project's own documentation, with a small chat template so that
/v1/chat/completions works too. The same inputs and seed give the same files.

Building needs `torch`, `transformers` and `tokenizers`, which live in the engine environment
(.venv-engine), not in the project's: the builder runs as a script with that interpreter,

    .venv-engine/bin/python executor/tinymodel.py DEST [--seed N]

and `ensure_tiny_model()` (importable from the project's environment, it imports none of those
libraries) runs it once and caches the result in .venv-engine/models/tiny-moe (the engine
environment is $RACKPLAN_ENGINE_VENV when set).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "simulator" / "specs" / "presets" / "models" / "tiny-moe.json"
CORPUS_GLOBS = ("README.md", "docs/*.md")
"""Text the tokenizer is trained on, relative to the repository root."""
ENGINE_VENV = Path(os.environ.get("RACKPLAN_ENGINE_VENV") or ROOT / ".venv-engine")
"""The engine environment (as in executor.backends.local.engine_venv)."""
CACHE = ENGINE_VENV / "models" / "tiny-moe"
STAMP = ".rackplan-tinymodel.json"
"""File in the model folder recording what built it (the cache key)."""
BUILDER_VERSION = 1
"""Bumped when the builder changes what it writes."""
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus_files(root: Path = ROOT) -> list[Path]:
    """The training text files, in a fixed order."""
    files = sorted({p for g in CORPUS_GLOBS for p in root.glob(g) if p.is_file()})
    if not files:
        raise FileNotFoundError(
            f"no tokenizer training text under {root} ({', '.join(CORPUS_GLOBS)})")
    return files


def cache_key(seed: int, root: Path = ROOT) -> dict[str, object]:
    """What the built files depend on: the preset, the training text, the seed, the builder."""
    h = hashlib.sha256()
    for p in corpus_files(root):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return {"builder": BUILDER_VERSION, "seed": seed,
            "preset": hashlib.sha256(PRESET.read_bytes()).hexdigest(),
            "corpus": h.hexdigest()}


def is_built(dest: Path, seed: int = 0) -> bool:
    """Whether `dest` holds the model this builder would write for `seed` now."""
    stamp = dest / STAMP
    try:
        return bool(json.loads(stamp.read_text()) == cache_key(seed))
    except (OSError, ValueError):
        return False


def ensure_tiny_model(dest: Path = CACHE, python: Path | None = None, seed: int = 0) -> Path:
    """The tiny-moe model folder, built with the engine environment's interpreter if it is
    missing or stale; RuntimeError with the builder's output if the build fails."""
    if is_built(dest, seed):
        return dest
    py = python or ENGINE_VENV / "bin" / "python"
    if not Path(py).exists():
        raise RuntimeError(f"engine interpreter {py} not found; run `make engine` first")
    proc = subprocess.run([str(py), str(Path(__file__).resolve()), str(dest), "--seed", str(seed)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"building the tiny-moe model into {dest} failed "
                           f"(exit {proc.returncode}):\n{tail}")
    return dest


def build(dest: Path, seed: int = 0) -> Path:
    """Write the model, tokenizer and stamp into `dest` (built beside it, then renamed)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

    preset = json.loads(PRESET.read_text())
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        # Tokenizer: byte-level BPE filling the model's vocabulary exactly.
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=preset["vocab_size"], special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        text = [p.read_text(encoding="utf-8") for p in corpus_files()]
        bpe.train_from_iterator(text, trainer=trainer)
        tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=SPECIAL_TOKENS[0],
                                      bos_token=SPECIAL_TOKENS[0], pad_token=SPECIAL_TOKENS[0],
                                      model_max_length=preset["max_position_embeddings"])
        tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(work)
        if len(tok) > preset["vocab_size"]:
            raise ValueError(f"tokenizer has {len(tok)} tokens, above the model's vocabulary "
                             f"of {preset['vocab_size']}")

        # Model: the preset's config, seeded random weights.
        eos = tok.convert_tokens_to_ids(SPECIAL_TOKENS[0])
        fields = {k: v for k, v in preset.items() if k not in ("architectures", "model_type",
                                                                "torch_dtype")}
        config = Qwen3MoeConfig(**fields, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
        config.architectures = preset["architectures"]
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
        model.generation_config.bos_token_id = eos
        model.generation_config.eos_token_id = eos
        model.generation_config.pad_token_id = eos
        model.save_pretrained(work, safe_serialization=True)

        (work / STAMP).write_text(json.dumps(cache_key(seed), sort_keys=True) + "\n")
        work.chmod(0o755)  # mkdtemp makes it private; the model is ordinary data
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return dest


def main(argv: list[str] | None = None) -> int:
    """Build the tiny-moe model into the folder given (the engine environment's interpreter)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("dest", type=Path, help="folder to write the model into")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    args = ap.parse_args(argv)
    if is_built(args.dest, args.seed):
        print(f"{args.dest}: up to date")
        return 0
    build(args.dest, args.seed)
    print(f"{args.dest}: built")
    return 0


if __name__ == "__main__":
    sys.exit(main())
