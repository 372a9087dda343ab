"""The P/D handoff as rackplan deploys it: which connector, and what the decode instance then
computes itself in a handed-over request's first step."""

import pytest

from simulator.des import simulate
from simulator.specs.handoff import CPU_BLOCK_SIZE, handoff_for
from simulator.specs.loading import load_deployment, load_workload

PD = {"model": "tiny-moe", "hardware": "cpu",
      "precision": {"weights": "bf16", "kv_cache": "bf16"},
      "prefill": {"instances": 1, "max_num_seqs": 8, "max_num_batched_tokens": 512},
      "decode": {"instances": 1, "max_num_seqs": 8, "max_num_batched_tokens": 512}}


@pytest.mark.parametrize(("prompt", "tail"), [
    (64, 32),   # stores and looks for the first 32 tokens: computes the other 32
    (66, 2),    # stores and looks for 64
    (65, 65),   # stores 64, looks for 32: finds nothing, computes the whole prompt
    (33, 33),   # stores 32, looks for 0
    (1, 0),
])
def test_example_connector_leaves_the_decode_side_what_it_does_not_hand_over(prompt, tail):
    assert CPU_BLOCK_SIZE == 32
    got = handoff_for("cpu")
    assert got.connector == "ExampleConnector"
    assert got.tail(prompt) == tail


def test_nixl_hands_over_every_block_so_the_first_step_is_a_decode_row():
    got = handoff_for("h200")
    assert got.connector == "NixlConnector"
    assert got.tail(64) == got.tail(65) == 0


def _pd_at(prompt: int) -> dict:
    workload = load_workload({"arrival": {"kind": "closed", "concurrency": 1}, "requests": 4,
                              "input_tokens": {"kind": "fixed", "value": prompt},
                              "output_tokens": {"kind": "fixed", "value": 8}, "seed": 0})
    return simulate(load_deployment(PD), workload).metrics()


def test_the_decode_instance_prices_the_prompt_tail_in_its_first_step():
    """A 66-token prompt prefills longer than a 64-token one, but its decode instance computes 2
    tokens of it against 32, so its first token comes sooner; a 65-token prompt is computed
    twice, whole. The tail step is the first token's, so TPOT does not see it."""
    at64, at65, at66 = (_pd_at(n) for n in (64, 65, 66))
    assert at66["ttft_ms"]["p50"] < at64["ttft_ms"]["p50"] < at65["ttft_ms"]["p50"]
    assert at64["tpot_ms"]["p50"] == pytest.approx(at66["tpot_ms"]["p50"], rel=1e-3)
