"""Fused MoE: our Triton kernel (in the interpreter) and the torch grouped implementation
against the fp32 reference; the alignment by expert; a wrong kernel fails the check."""

import pytest

from tests.kernels.conftest import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
pytest.importorskip("triton", reason=TORCH_MISSING)

from kernels import moe  # noqa: E402
from kernels.checks import KernelMismatch, assert_close, generator  # noqa: E402
from kernels.device import detect  # noqa: E402
from kernels.moe_triton import align_by_expert, fused_moe  # noqa: E402
from kernels.shapes import MoeShape  # noqa: E402

SHAPES = [
    MoeShape(1, 64, 32, 2, 8, 1, 1),      # one token: most blocks empty
    MoeShape(37, 128, 96, 2, 8, 1, 1),    # partial blocks, inter not a block multiple
    MoeShape(40, 64, 64, 3, 12, 3, 1),    # an EP rank holding a third of the experts
    MoeShape(300, 64, 48, 4, 8, 1, 1),    # > 32 rows per expert: the 64-row blocks
]


@pytest.mark.parametrize("s", SHAPES, ids=lambda s: f"t{s.tokens}-e{s.experts}-ep{s.ep}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_triton_fused_moe_matches_reference(s, dtype):
    x, w1, w2, ids, weights = moe._layer(s, generator("cpu", 7))
    x, w1, w2 = x.to(dtype), w1.to(dtype), w2.to(dtype)
    want = moe.moe_reference(x, w1, w2, ids, weights)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert_close("triton", fused_moe(x, w1, w2, ids, weights), want, atol=tol, rtol=tol)
    assert_close("torch", moe.moe_torch(x, w1, w2, ids, weights), want, atol=tol, rtol=tol)


def test_ep_rank_computes_only_its_experts():
    s = MoeShape(24, 64, 32, 2, 8, 2, 1)
    x, w1, w2, ids, weights = moe._layer(s, generator("cpu", 3))
    # The second rank's slice of experts 4..7; the first rank's tokens contribute nothing.
    got = fused_moe(x, w1, w2, ids, weights, first_expert=4)
    want = moe.moe_reference(x, w1, w2, ids, weights, first_expert=4)
    assert_close("ep rank 1", got, want, atol=2e-2, rtol=2e-2)
    mine = ((ids >= 4) & (ids < 8)).any(dim=1)
    assert torch.all(got[~mine] == 0) and torch.all(got[mine].abs().sum(dim=1) > 0)


def test_alignment_puts_each_assignment_once_in_its_experts_blocks():
    gen = generator("cpu", 0)
    ids, _ = moe.balanced_routing(29, 3, 10, gen)
    block = 16
    sorted_ids, block_expert = align_by_expert(ids, 5, 5, block)  # experts 5..9 are local
    n = ids.numel()
    flat = ids.reshape(-1)
    seen = []
    for b, e in enumerate(block_expert.tolist()):
        rows = sorted_ids[b * block:(b + 1) * block].tolist()
        if e < 0:
            assert all(r == n for r in rows)
            continue
        real = [r for r in rows if r < n]
        assert all(int(flat[r]) == e + 5 for r in real)
        seen += real
    local = [a for a in range(n) if 5 <= int(flat[a]) < 10]
    assert sorted(seen) == local


def test_balanced_routing_spreads_load_evenly():
    ids, weights = moe.balanced_routing(1000, 8, 256, generator("cpu", 0))
    counts = torch.bincount(ids.reshape(-1), minlength=256)
    assert int(counts.max() - counts.min()) <= 1
    assert torch.allclose(weights.sum(dim=1), torch.ones(1000))
    assert all(len(set(row)) == 8 for row in ids.tolist())


def test_check_passes_and_fails_loudly_on_a_wrong_kernel(monkeypatch):
    dev = detect("cpu")
    moe.check(dev, triton=True)
    monkeypatch.setattr(moe, "moe_torch", lambda x, *a, **k: torch.zeros_like(x))
    with pytest.raises(KernelMismatch, match=r"moe .* \(torch\): max abs error"):
        moe.check(dev, triton=False)
