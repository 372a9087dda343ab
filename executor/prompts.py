"""Prompts of their own for `vllm bench serve`: no two share a token past the common prefix.

vLLM's random dataset builds each prompt as a run of consecutive token ids from a random start,
so over a vocabulary of V tokens it has about V distinct prompts of a length. tiny-moe's 1,024
tokens allow about a thousand, a closed loop sends ten thousand to one engine, and the engine's
prefix cache then serves prompt tokens that every prediction counts as computed (32-51 % of
them, logged by the engines). This module writes the same traffic as a JSONL file for bench
serve's custom dataset: the lengths drawn as vLLM draws them (integer-uniform over
length x (1 +- range ratio), the tokenizer's special tokens taken off the input), the shared
prefix drawn once per seed, and every prompt's own tokens drawn at random from the vocabulary's
whole-word tokens (a space and letters, each of which the tokenizer reads back as itself), so
that a prompt of 32 own tokens is one of more than 16^32 and prompts repeat neither within a
run nor across runs with other seeds.

Writing needs the model's tokenizer, which lives in the engine environment: the writer runs as
a script with that interpreter (`python executor/prompts.py SPEC.json`), like
executor/tinymodel.py, and `write_prompts` (importable here; it imports none of the tokenizer
libraries) runs it. The file is written beside its destination and renamed into place.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WORD = re.compile(r" [A-Za-z]{2,16}")
"""A whole-word token: a space and letters (byte-level BPE's 'Ġword', decoded)."""
MIN_WORDS = 16
"""Fewer whole-word tokens than this: draw from every ordinary token and adjust as vLLM does."""
MAX_WORDS = 4096
"""Enough words to draw from; a large vocabulary is not scanned past this many."""
ADJUST_TRIES = 10
"""Decode / re-encode rounds for a prompt whose text reads back at another length (vLLM's
gen_prompt_decode_to_target_len takes 10 too)."""
TIMEOUT_S = 600.0


class PromptError(RuntimeError):
    """The prompts could not be written; the message quotes the writer's output."""


def write_prompts(dest: Path, *, tokenizer: str, python: Path, num_prompts: int, input_len: int,
                  output_len: int, input_range: float = 0.0, output_range: float = 0.0,
                  prefix_len: int = 0, seed: int = 0) -> dict[str, Any]:
    """Write `num_prompts` prompts to `dest` (JSONL: prompt, output_tokens) with the engine
    interpreter `python`; the writer's summary (prompts, words, mismatched, input_tokens).
    PromptError quoting its output when it fails."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    spec = {"dest": str(dest), "tokenizer": tokenizer, "num_prompts": num_prompts,
            "input_len": input_len, "output_len": output_len, "input_range": input_range,
            "output_range": output_range, "prefix_len": prefix_len, "seed": seed}
    fd, spec_path = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".spec.json",
                                     dir=dest.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        try:
            proc = subprocess.run([str(python), str(Path(__file__).resolve()), spec_path],
                                  capture_output=True, text=True, check=False,
                                  stdin=subprocess.DEVNULL, timeout=TIMEOUT_S,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
        except subprocess.TimeoutExpired:
            raise PromptError(f"writing {num_prompts} prompts to {dest} ran past "
                              f"{TIMEOUT_S:g} s") from None
    finally:
        os.unlink(spec_path)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
        raise PromptError(f"writing prompts with tokenizer {tokenizer} failed "
                          f"(exit {proc.returncode}):\n{tail}")
    try:
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        raise PromptError(f"the prompt writer printed no summary: {proc.stdout[-400:]!r}") \
            from None


def lengths(real_len: int, range_ratio: float) -> tuple[int, int]:
    """(low, high) of a length drawn as vLLM's random dataset draws it."""
    return (math.floor(real_len * (1 - range_ratio)), math.ceil(real_len * (1 + range_ratio)))


# The writer: runs with the engine environment's interpreter.

class _Tokenizer:
    """encode / decode over a `tokenizers` file or a transformers tokenizer."""

    def __init__(self, name: str) -> None:
        path = Path(name) / "tokenizer.json"
        if path.is_file():  # the fast library alone: it loads in a fraction of a second
            from tokenizers import Tokenizer
            tok = Tokenizer.from_file(str(path))
            self.size = tok.get_vocab_size(with_added_tokens=True)
            self.special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
            self._enc = lambda texts, sp: [e.ids for e in tok.encode_batch(
                texts, add_special_tokens=sp)]
            self._dec = lambda seqs: tok.decode_batch(seqs, skip_special_tokens=False)
        else:
            from transformers import AutoTokenizer
            hf = AutoTokenizer.from_pretrained(name)
            self.size = len(hf)
            self.special = set(hf.all_special_ids)
            self._enc = lambda texts, sp: [hf.encode(t, add_special_tokens=sp) for t in texts]
            self._dec = lambda seqs: [hf.decode(s) for s in seqs]

    def encode(self, texts: list[str], special: bool = False) -> list[list[int]]:
        return list(self._enc(texts, special))

    def decode(self, seqs: list[list[int]]) -> list[str]:
        return list(self._dec(seqs))


def _words(tok: _Tokenizer) -> list[int]:
    """Whole-word tokens that read back as themselves; every ordinary token if too few."""
    ordinary = [i for i in range(tok.size) if i not in tok.special]
    words: list[int] = []
    for start in range(0, len(ordinary), 8192):
        ids = ordinary[start:start + 8192]
        texts = tok.decode([[i] for i in ids])
        keep = [(i, t) for i, t in zip(ids, texts, strict=True) if WORD.fullmatch(t)]
        back = tok.encode([t for _, t in keep])
        words += [i for (i, _), b in zip(keep, back, strict=True) if b == [i]]
        if len(words) >= MAX_WORDS:
            return words[:MAX_WORDS]
    return words if len(words) >= MIN_WORDS else ordinary


def build(spec: dict[str, Any]) -> dict[str, Any]:
    """Write the prompts `spec` describes; their summary."""
    import numpy as np

    tok = _Tokenizer(spec["tokenizer"])
    words = np.array(_words(tok))
    rng = np.random.default_rng(spec["seed"])
    special = len(tok.encode(["a"], True)[0]) - len(tok.encode(["a"])[0])
    n = spec["num_prompts"]
    lo, hi = lengths(max(0, spec["input_len"] - special), spec["input_range"])
    out_lo, out_hi = (max(1, x) for x in lengths(spec["output_len"], spec["output_range"]))
    inputs = rng.integers(lo, hi + 1, size=n)
    outputs = rng.integers(out_lo, out_hi + 1, size=n)
    prefix = rng.choice(words, size=spec["prefix_len"]).tolist()
    seqs = [prefix + rng.choice(words, size=int(k)).tolist() for k in inputs]
    targets = [len(s) for s in seqs]
    texts = tok.decode(seqs)
    for _ in range(ADJUST_TRIES):
        back = tok.encode(texts)
        off = [i for i, (b, t) in enumerate(zip(back, targets, strict=True)) if len(b) != t]
        if not off:
            break
        for i in off:  # cut what reads back longer, fill what reads back shorter
            b, t = back[i], targets[i]
            seqs[i] = b[:t] if len(b) > t else b + rng.choice(words, size=t - len(b)).tolist()
        for i, text in zip(off, tok.decode([seqs[i] for i in off]), strict=True):
            texts[i] = text
    got = [len(b) for b in tok.encode(texts)]
    mismatched = sum(g != t for g, t in zip(got, targets, strict=True))
    dest = Path(spec["dest"])
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for text, k in zip(texts, outputs, strict=True):
                f.write(json.dumps({"prompt": text, "output_tokens": int(k)}) + "\n")
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the prompts are ordinary data
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {"prompts": n, "words": len(words), "mismatched": mismatched,
            "input_tokens": sum(got) + special * n}


def main(argv: list[str] | None = None) -> int:
    """Write the prompts a spec file describes; print their summary as one JSON line."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python executor/prompts.py SPEC.json", file=sys.stderr)
        return 2
    print(json.dumps(build(json.loads(Path(args[0]).read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
