"""Memory per rank: what a rank holds."""

import pytest

from simulator.cost.memory import rank_memory
from simulator.specs.deployment import RoleSpec, Speculative
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model

R1 = load_model("deepseek-r1")
H200 = load_hardware("h200")


def test_a_rank_without_speculative_decoding_holds_no_mtp_layer():
    plain = rank_memory(R1, H200, RoleSpec(dep=16), "fp8", "fp8")
    spec = rank_memory(R1, H200, RoleSpec(dep=16, speculative=Speculative(tokens=1)), "fp8",
                       "fp8")
    mtp = R1.weight_bytes("fp8")["mtp"]
    extra = spec.weights - plain.weights
    # the MTP layer's routed experts are spread over the 16 EP ranks, the rest is replicated
    experts = mtp * R1.n_routed_experts * R1.expert_params() / R1.params()["mtp"]
    assert extra == pytest.approx(mtp - experts + experts / 16)
    assert 0 < extra < mtp
