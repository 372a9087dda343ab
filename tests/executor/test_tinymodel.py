"""executor/tinymodel: the tiny-moe model is built offline, matches its preset, and the same
seed gives the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor import tinymodel
from executor.tinymodel import PRESET, STAMP, cache_key, ensure_tiny_model, is_built

ENGINE_PYTHON = tinymodel.ENGINE_VENV / "bin" / "python"
needs_engine = pytest.mark.skipif(
    not ENGINE_PYTHON.exists(),
    reason=f"the engine environment is missing ({ENGINE_PYTHON} not found); run `make engine`")


def test_cache_key_follows_seed_and_is_checked(tmp_path):
    assert cache_key(0) == cache_key(0) and cache_key(0) != cache_key(1)
    assert not is_built(tmp_path)
    (tmp_path / STAMP).write_text(json.dumps(cache_key(1)))
    assert is_built(tmp_path, seed=1) and not is_built(tmp_path, seed=0)


def test_missing_engine_interpreter_is_named(tmp_path):
    with pytest.raises(RuntimeError, match=r"engine interpreter .*nope/python not found"):
        ensure_tiny_model(tmp_path / "m", python=tmp_path / "nope" / "python")


@needs_engine
def test_build_is_deterministic_and_matches_the_preset(tmp_path):
    a = ensure_tiny_model(tmp_path / "a", python=ENGINE_PYTHON)
    b = ensure_tiny_model(tmp_path / "b", python=ENGINE_PYTHON)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", STAMP} <= set(names)
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    config, preset = json.loads((a / "config.json").read_text()), json.loads(PRESET.read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "num_experts_per_tok", "vocab_size", "moe_intermediate_size"):
        assert config[key] == preset[key], key
    assert config.get("num_experts", config.get("num_local_experts")) == preset["num_experts"]
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    vocab = json.loads((a / "tokenizer.json").read_text())["model"]["vocab"]
    assert 512 < len(vocab) <= preset["vocab_size"]
    assert is_built(a) and ensure_tiny_model(a, python=Path("/nonexistent")) == a  # cached
