"""GQA attention: the paged Triton decode kernel (in the interpreter), the torch decode and
prefill, all against the fp32 reference."""

import pytest

from tests.kernels.conftest import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
pytest.importorskip("triton", reason=TORCH_MISSING)

from kernels import attention  # noqa: E402
from kernels.attention import PagedCache, decode_torch, decode_triton, reference  # noqa: E402
from kernels.checks import KernelMismatch, assert_close, generator, randn  # noqa: E402
from kernels.device import detect  # noqa: E402


def expected(q, cache, lens):
    k, v = cache.contiguous(torch.float32)
    out = [reference(q[i:i + 1, :, None], k[i:i + 1, :, :n], v[i:i + 1, :, :n], causal=False)
           for i, n in enumerate(lens)]
    return torch.cat(out)[:, :, 0]


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 2, 32), (6, 6, 64), (12, 1, 48)])
def test_triton_paged_decode_matches_reference(kv, splits, heads, kv_heads, dim):
    gen = generator("cpu", 1)
    cache = PagedCache(3, 290, kv_heads, dim, kv, gen)
    cache.lens = torch.tensor([290, 17, 129], dtype=torch.int32)  # ragged requests
    q = randn((3, heads, dim), gen, torch.bfloat16)
    want = expected(q, cache, cache.lens.tolist())
    assert_close("triton decode", decode_triton(q, cache, splits), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_torch_decode_matches_reference(kv):
    gen = generator("cpu", 2)
    cache = PagedCache(4, 100, 2, 32, kv, gen)
    q = randn((4, 8, 32), gen, torch.bfloat16)
    assert_close("torch decode", decode_torch(q, cache), expected(q, cache, [100] * 4),
                 atol=2e-2, rtol=2e-2)


def test_fp8_cache_holds_fp8_with_a_scale():
    cache = PagedCache(2, 40, 2, 16, "fp8", generator("cpu", 0))
    assert cache.k.element_size() == 1 and cache.kv_scale != 1.0
    k, _ = cache.contiguous(torch.float32)
    assert float(k.abs().max()) > 1.0  # the scale brings back the values' range


def test_prefill_is_causal_attention_and_fills_the_cache():
    gen = generator("cpu", 3)
    b, s, h, kvh, d = 2, 23, 4, 2, 32
    q, k, v = (randn((b, n, s, d), gen, torch.bfloat16) for n in (h, kvh, kvh))
    kc = torch.zeros(b * s, kvh, d, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    got = attention.prefill_torch(q, k, v, kc, vc)
    assert_close("prefill", got, reference(q, k, v, causal=True), atol=2e-2, rtol=2e-2)
    assert torch.equal(kc.view(b, s, kvh, d).transpose(1, 2), k)
    # The first token attends only to itself: its output is its own value.
    assert_close("first token", got[:, :, 0], v.repeat_interleave(2, 1)[:, :, 0], 1e-2, 1e-2)


def test_check_runs_triton_and_fails_on_a_wrong_kernel(monkeypatch):
    dev = detect("cpu")
    attention.check(dev, triton=True)
    monkeypatch.setattr(attention, "decode_triton", lambda q, cache, splits=None: q * 0)
    with pytest.raises(KernelMismatch, match="triton, 1 splits"):
        attention.check(dev, triton=True)
