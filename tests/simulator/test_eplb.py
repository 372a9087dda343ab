"""Tests for simulator.eplb, our numpy port of DeepSeek's EPLB algorithm."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.eplb import Placement, identity_placement, imbalance, rebalance
from simulator.specs.errors import SpecError

# DeepSeek's published EPLB README example (github.com/deepseek-ai/EPLB, README.md,
# "Interface and Example"): 2 layers x 12 experts, 16 replicas, 4 groups, 2 nodes,
# 8 GPUs. EXAMPLE_PHY2LOG is the phy2log that README prints for this input.
EXAMPLE_WEIGHT = np.array(
    [
        [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
        [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
    ]
)
EXAMPLE_PHY2LOG = np.array(
    [
        [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
        [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
    ]
)
EXAMPLE_ARGS = (16, 4, 2, 8)  # num_replicas, num_groups, num_nodes, num_gpus


def _skewed_load(layers: int, experts: int, seed: int = 7) -> np.ndarray:
    """Power-law (Pareto) tokens per expert, from a seeded generator."""
    rng = np.random.default_rng(seed)
    return (rng.pareto(1.2, size=(layers, experts)) + 1.0) * 1000.0


def _check_consistent(p: Placement, num_replicas: int) -> None:
    layers, experts = p.replicas.shape
    assert p.phy2log.shape == (layers, num_replicas)
    assert p.log2phy.shape == (layers, experts, int(p.replicas.max()))
    assert (p.replicas >= 1).all()
    assert (p.replicas.sum(axis=1) == num_replicas).all()
    for layer in range(layers):
        counts = np.bincount(p.phy2log[layer], minlength=experts)
        np.testing.assert_array_equal(counts, p.replicas[layer])
        for expert in range(experts):
            row = p.log2phy[layer, expert]
            n = p.replicas[layer, expert]
            assert (row[n:] == -1).all()
            assert (p.phy2log[layer, row[:n]] == expert).all()
            np.testing.assert_array_equal(
                np.sort(row[:n]), np.flatnonzero(p.phy2log[layer] == expert)
            )


def test_readme_example_phy2log_exact() -> None:
    p = rebalance(EXAMPLE_WEIGHT, *EXAMPLE_ARGS)
    np.testing.assert_array_equal(p.phy2log, EXAMPLE_PHY2LOG)
    _check_consistent(p, 16)


@pytest.mark.parametrize(
    ("layers", "experts", "args"),
    [
        (2, 12, EXAMPLE_ARGS),
        (3, 12, (24, 3, 2, 4)),  # 3 groups on 2 nodes: global policy
        (4, 64, (80, 8, 2, 8)),
        (2, 256, (288, 8, 4, 32)),
        (2, 16, (16, 4, 2, 16)),  # no redundancy, one slot per GPU
    ],
)
def test_placement_is_consistent(
    layers: int, experts: int, args: tuple[int, int, int, int]
) -> None:
    p = rebalance(_skewed_load(layers, experts), *args)
    _check_consistent(p, args[0])


def test_hierarchical_keeps_each_group_on_one_node() -> None:
    num_replicas, num_groups, num_nodes, _ = args = (96, 8, 4, 16)
    weight = _skewed_load(3, 64)
    p = rebalance(weight, *args)
    group_of_slot = p.phy2log // (64 // num_groups)
    node_groups = group_of_slot.reshape(3, num_nodes, num_replicas // num_nodes)
    for layer in range(3):
        per_node = [set(node_groups[layer, n].tolist()) for n in range(num_nodes)]
        assert all(len(groups) == num_groups // num_nodes for groups in per_node)
        assert set().union(*per_node) == set(range(num_groups))


def test_global_policy_when_nodes_do_not_divide_groups() -> None:
    weight = _skewed_load(2, 12)
    uneven = rebalance(weight, 24, 3, 2, 4)
    flat = rebalance(weight, 24, 1, 1, 4)
    np.testing.assert_array_equal(uneven.phy2log, flat.phy2log)
    np.testing.assert_array_equal(uneven.log2phy, flat.log2phy)


def test_deterministic_and_input_untouched() -> None:
    weight = np.ones((2, 32))  # all ties
    before = weight.copy()
    a = rebalance(weight, 48, 4, 2, 8)
    b = rebalance(weight, 48, 4, 2, 8)
    np.testing.assert_array_equal(a.phy2log, b.phy2log)
    np.testing.assert_array_equal(a.log2phy, b.log2phy)
    np.testing.assert_array_equal(weight, before)


def test_identity_placement_and_rank_load() -> None:
    p = identity_placement(2, 8)
    np.testing.assert_array_equal(p.phy2log, np.tile(np.arange(8), (2, 1)))
    np.testing.assert_array_equal(p.log2phy[:, :, 0], p.phy2log)
    load = np.arange(16, dtype=float).reshape(2, 8)
    np.testing.assert_allclose(p.rank_load(load, 4), load.reshape(2, 4, 2).sum(axis=2))
    assert imbalance(np.full((3, 4), 5.0)) == 0.0
    assert imbalance(np.array([[1.0, 3.0]])) == pytest.approx(0.5)


def test_rank_load_conserves_tokens() -> None:
    load = _skewed_load(2, 12)
    rl = rebalance(load, *EXAMPLE_ARGS).rank_load(load, 8)
    assert rl.shape == (2, 8)
    np.testing.assert_allclose(rl.sum(axis=1), load.sum(axis=1))


@pytest.mark.parametrize(("num_groups", "num_nodes"), [(8, 4), (8, 16)])
def test_redundant_experts_lower_peak_rank_load(num_groups: int, num_nodes: int) -> None:
    layers, experts, ranks = 4, 256, 32
    load = _skewed_load(layers, experts)
    before = identity_placement(layers, experts).rank_load(load, ranks)
    after = rebalance(load, experts + 32, num_groups, num_nodes, ranks).rank_load(load, ranks)
    peak_before = (before.max(axis=1) / before.mean(axis=1)).mean()
    peak_after = (after.max(axis=1) / after.mean(axis=1)).mean()
    assert peak_after < peak_before
    assert imbalance(after) < imbalance(before)


@pytest.mark.parametrize(
    ("weight", "args", "needle"),
    [
        (EXAMPLE_WEIGHT, (100, 4, 2, 8), "num_replicas=100"),
        (EXAMPLE_WEIGHT, (8, 4, 2, 8), "num_replicas=8"),
        (EXAMPLE_WEIGHT, (16, 5, 2, 8), "num_groups=5"),
        (EXAMPLE_WEIGHT, (16, 4, 3, 8), "num_gpus=8"),
        (EXAMPLE_WEIGHT, (16, 4, 0, 8), "num_nodes=0"),
        (EXAMPLE_WEIGHT, (16, 4, 2, 2.5), "num_gpus=2.5"),
        (EXAMPLE_WEIGHT[0], EXAMPLE_ARGS, "(12,)"),
        (-EXAMPLE_WEIGHT, EXAMPLE_ARGS, "-90"),
        (np.full((2, 12), np.nan), EXAMPLE_ARGS, "nan"),
    ],
)
def test_rebalance_rejects_bad_input(weight: np.ndarray, args: tuple, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        rebalance(weight, *args)
    assert needle in str(err.value)


def test_helpers_reject_bad_input() -> None:
    p = rebalance(EXAMPLE_WEIGHT, *EXAMPLE_ARGS)
    with pytest.raises(SpecError, match="ranks=5"):
        p.rank_load(EXAMPLE_WEIGHT, 5)
    with pytest.raises(SpecError, match=r"\(2, 12\)"):
        p.rank_load(EXAMPLE_WEIGHT[:, :6], 8)
    with pytest.raises(SpecError, match="layers=0"):
        identity_placement(0, 4)
    with pytest.raises(SpecError, match=r"\(4,\)"):
        imbalance(np.ones(4))
