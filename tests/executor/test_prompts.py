"""executor/prompts: the benchmark's prompts are its own (no two alike, none like another
seed's), drawn at the lengths vLLM's random dataset draws, and bench serve is sent them."""

from __future__ import annotations

import json
import sys

import pytest

from executor import tinymodel
from executor.bench import BenchError, BenchSettings, with_prompt_file
from executor.prompts import lengths, write_prompts
from executor.tinymodel import ensure_tiny_model
from tests.executor.local_helpers import fake_vllm

ENGINE_PYTHON = tinymodel.ENGINE_VENV / "bin" / "python"
needs_engine = pytest.mark.skipif(
    not ENGINE_PYTHON.exists(),
    reason=f"the engine environment is missing ({ENGINE_PYTHON} not found); run `make engine`")


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_lengths_are_vllm_s_integer_uniform_range():
    assert lengths(448, 0.0) == (448, 448)
    assert lengths(448, 0.5) == (224, 672)
    assert lengths(10, 0.25) == (7, 13)  # floor below, ceil above


@needs_engine
def test_prompts_are_their_own_at_the_drawn_lengths(tmp_path):
    model = str(ensure_tiny_model(python=ENGINE_PYTHON))
    common = dict(tokenizer=model, python=ENGINE_PYTHON, num_prompts=300, input_len=64,
                  output_len=8, input_range=0.5, output_range=0.25, prefix_len=16)
    summary = write_prompts(tmp_path / "a.jsonl", seed=1, **common)
    a = read(tmp_path / "a.jsonl")
    assert summary["prompts"] == len(a) == 300 and summary["mismatched"] == 0
    # every token a whole word: the text's words are its tokens
    words = [tuple(p["prompt"].split()) for p in a]
    assert summary["input_tokens"] == sum(map(len, words))
    assert {len(w) - 16 for w in words} <= set(range(32, 97)) and \
        max(len(w) for w in words) - min(len(w) for w in words) > 32
    assert {p["output_tokens"] for p in a} <= set(range(6, 11))
    assert len({w[:16] for w in words}) == 1  # the shared prefix
    assert len({w[16:48] for w in words}) == 300  # no two alike past it
    write_prompts(tmp_path / "b.jsonl", seed=1, **common)
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()
    write_prompts(tmp_path / "c.jsonl", seed=2, **common)
    assert not {w[16:] for w in words} & {tuple(p["prompt"].split()[16:])
                                         for p in read(tmp_path / "c.jsonl")}


def test_bench_serve_is_sent_the_file_as_its_custom_dataset():
    s = BenchSettings(input_len=64, output_len=8, num_prompts=5, max_concurrency=2,
                      dataset_path="p.jsonl")
    args = s.args()
    assert args[:8] == ["--dataset-name", "custom", "--dataset-path", "p.jsonl",
                        "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle"]
    assert not [a for a in args if a.startswith("--random")]
    assert args[args.index("--num-prompts") + 1] == "5" and "--max-concurrency" in args


def test_without_an_interpreter_beside_the_engine_the_random_dataset_is_noted(tmp_path):
    s = BenchSettings(input_len=64, output_len=8)
    got = with_prompt_file(s, tmp_path / "p.jsonl", fake_vllm(tmp_path), "m")
    assert got.dataset_path is None and "random dataset" in got.notes[-1]
    assert not (tmp_path / "p.jsonl").exists()


def test_a_writer_that_fails_is_a_bench_error_quoting_it(tmp_path):
    exe = fake_vllm(tmp_path)
    (tmp_path / "python").symlink_to(sys.executable)  # an interpreter, but no such tokenizer
    with pytest.raises(BenchError, match=r"writing prompts with tokenizer .*nope failed"):
        with_prompt_file(BenchSettings(input_len=64, output_len=8), tmp_path / "p.jsonl", exe,
                    str(tmp_path / "nope"))
    assert not list(tmp_path.glob("*.jsonl")) and not list(tmp_path.glob(".p.jsonl*"))
