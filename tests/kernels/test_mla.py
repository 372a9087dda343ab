"""MLA block: absorbed decode and prefill against references that expand every latent."""

import dataclasses

import pytest

from tests.kernels.conftest import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)

from kernels import mla  # noqa: E402
from kernels.checks import KernelMismatch, assert_close, generator, randn  # noqa: E402
from kernels.device import detect  # noqa: E402


def test_check_passes():
    mla.check(detect("cpu"))


@pytest.mark.parametrize("q_lora", [0, 40])
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_absorbed_decode_equals_expanded_attention(q_lora, kv):
    s = dataclasses.replace(mla.CHECK, q_lora=q_lora, heads=3, rope=8, v=24, kv_dtype=kv)
    gen = generator("cpu", 5)
    w = mla.MlaWeights.random(s, gen)
    cache = mla.LatentCache(2, 57, s.kv_lora + s.rope, kv, gen)
    x = randn((2, s.hidden), gen, torch.bfloat16)
    assert_close("mla", mla.decode_absorbed(w, x, cache), mla.reference_decode(w, x, cache),
                 atol=3e-2, rtol=3e-2)


def test_a_wrong_absorption_fails_the_check(monkeypatch):
    monkeypatch.setattr(mla, "decode_absorbed", lambda w, x, cache: x @ w.o.t()[: x.shape[1]])
    with pytest.raises(KernelMismatch, match="mla decode"):
        mla.check(detect("cpu"))
