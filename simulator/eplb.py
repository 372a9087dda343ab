"""Expert-parallel load balancing (EPLB) for MoE serving, in numpy.

This is our own implementation of the algorithm DeepSeek published as EPLB
(github.com/deepseek-ai/EPLB), which vLLM uses to place redundant experts.
Given a per-layer load estimate for every logical expert, it decides how many
physical replicas each expert gets and which physical slot (and so which GPU)
holds each replica:

* hierarchical policy, used when ``num_nodes`` divides ``num_groups``: whole
  expert groups are packed onto nodes so node loads are even, experts are
  replicated within each node, then each node's replicas are packed onto its
  GPUs;
* global policy, otherwise: the same steps with one group and one node, so
  experts are replicated and packed across all GPUs regardless of groups.

Physical slots are numbered GPU-major: GPU ``g`` owns slots
``g * slots_per_gpu`` to ``(g + 1) * slots_per_gpu - 1``. Every step is
deterministic: ties go to the lower index (stable sorts, first argmin/argmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from simulator.specs.errors import SpecError

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

__all__ = ["Placement", "identity_placement", "imbalance", "rebalance"]


@dataclass(frozen=True)
class Placement:
    """Where each logical expert's replicas live, per MoE layer.

    Attributes:
        phy2log: ``(layers, slots)`` logical expert held by each physical slot.
        log2phy: ``(layers, experts, max_replicas)`` physical slots holding each
            logical expert, padded with -1.
        replicas: ``(layers, experts)`` number of replicas of each logical expert.
    """

    phy2log: IntArray
    log2phy: IntArray
    replicas: IntArray

    @property
    def layers(self) -> int:
        """Number of MoE layers."""
        return int(self.phy2log.shape[0])

    @property
    def experts(self) -> int:
        """Number of logical experts per layer."""
        return int(self.replicas.shape[1])

    @property
    def slots(self) -> int:
        """Number of physical expert slots per layer."""
        return int(self.phy2log.shape[1])

    def rank_load(self, expert_load: np.ndarray, ranks: int) -> FloatArray:
        """Tokens each EP rank processes under this placement.

        Args:
            expert_load: ``(layers, experts)`` tokens routed to each logical expert;
                an expert's tokens are split evenly over its replicas.
            ranks: number of EP ranks; slots are dealt to ranks in contiguous
                blocks of ``slots // ranks``.

        Returns:
            ``(layers, ranks)`` tokens per rank.
        """
        _check_positive("ranks", ranks)
        if self.slots % ranks:
            raise SpecError(
                f"ranks={ranks} must divide the number of physical slots ({self.slots})"
            )
        load = np.asarray(expert_load, dtype=np.float64)
        if load.shape != self.replicas.shape:
            raise SpecError(
                f"expert_load has shape {load.shape}; it must be (layers, experts) = "
                f"{self.replicas.shape}"
            )
        per_replica = load / self.replicas
        per_slot = np.take_along_axis(per_replica, self.phy2log, axis=1)
        per_rank: FloatArray = per_slot.reshape(self.layers, ranks, self.slots // ranks).sum(axis=2)
        return per_rank


def identity_placement(layers: int, experts: int) -> Placement:
    """Placement without redundancy: slot ``i`` holds logical expert ``i`` in every layer."""
    _check_positive("layers", layers)
    _check_positive("experts", experts)
    phy2log = np.tile(np.arange(experts, dtype=np.int64), (layers, 1))
    return Placement(
        phy2log=phy2log,
        log2phy=phy2log[:, :, None].copy(),
        replicas=np.ones((layers, experts), dtype=np.int64),
    )


def imbalance(rank_load: np.ndarray) -> float:
    """Mean over layers of ``(max - mean) / mean`` of the per-rank load.

    ``rank_load`` is ``(layers, ranks)``; 0 means perfectly balanced. A layer
    with no load at all counts as balanced.
    """
    load = np.asarray(rank_load, dtype=np.float64)
    if load.ndim != 2 or load.size == 0:
        raise SpecError(
            f"rank_load has shape {load.shape}; it must be a non-empty (layers, ranks) array"
        )
    mean = load.mean(axis=1)
    excess = load.max(axis=1) - mean
    per_layer = np.divide(excess, mean, out=np.zeros_like(mean), where=mean > 0)
    return float(per_layer.mean())


def rebalance(
    weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> Placement:
    """Replicate and place experts so per-GPU load is balanced (DeepSeek's EPLB).

    Args:
        weight: ``(layers, experts)`` estimated load of each logical expert.
        num_replicas: physical expert slots per layer, a multiple of ``num_gpus``
            and at least ``experts``.
        num_groups: expert groups (group-limited routing); must divide ``experts``.
        num_nodes: server nodes; ``num_gpus`` must be a multiple of it.
        num_gpus: GPUs (EP ranks) in total.

    Returns:
        The placement. The hierarchical policy is used when ``num_nodes`` divides
        ``num_groups``, the global policy (one group, one node) otherwise.
    """
    load = _check_weight(weight)
    experts = load.shape[1]
    for name, value in (
        ("num_replicas", num_replicas),
        ("num_groups", num_groups),
        ("num_nodes", num_nodes),
        ("num_gpus", num_gpus),
    ):
        _check_positive(name, value)
    if num_replicas < experts:
        raise SpecError(
            f"num_replicas={num_replicas} must be at least the number of logical "
            f"experts ({experts})"
        )
    if num_replicas % num_gpus:
        raise SpecError(f"num_replicas={num_replicas} must be a multiple of num_gpus={num_gpus}")
    if experts % num_groups:
        raise SpecError(
            f"num_groups={num_groups} must divide the number of logical experts ({experts})"
        )
    if num_gpus % num_nodes:
        raise SpecError(f"num_gpus={num_gpus} must be a multiple of num_nodes={num_nodes}")

    if num_groups % num_nodes == 0:
        phy2log, rank, replicas = _hierarchical(load, num_replicas, num_groups, num_nodes, num_gpus)
    else:
        phy2log, rank, replicas = _hierarchical(load, num_replicas, 1, 1, num_gpus)

    layers = load.shape[0]
    width = int(replicas.max())
    log2phy = np.full((layers, experts * width), -1, dtype=np.int64)
    slot_ids = np.broadcast_to(np.arange(num_replicas, dtype=np.int64), phy2log.shape)
    np.put_along_axis(log2phy, phy2log * width + rank, slot_ids, axis=1)
    return Placement(
        phy2log=phy2log, log2phy=log2phy.reshape(layers, experts, width), replicas=replicas
    )


def _hierarchical(
    load: FloatArray, slots: int, groups: int, nodes: int, gpus: int
) -> tuple[IntArray, IntArray, IntArray]:
    """Groups to nodes, replicas within nodes, replicas to GPUs.

    Returns ``(phy2log, replica_rank, replicas)``: the logical expert of each
    physical slot, which of that expert's replicas the slot holds, and the replica
    count of each logical expert.
    """
    layers, experts = load.shape
    group_size = experts // groups
    per_node = experts // nodes  # logical experts on each node
    slots_per_node = slots // nodes

    # 1. Pack whole groups onto nodes; lay experts out node-major ("node order").
    group_load = load.reshape(layers, groups, group_size).sum(axis=2)
    node, position = _balanced_packing(group_load, nodes)
    first = (node * (groups // nodes) + position) * group_size
    to_node_order = (first[:, :, None] + np.arange(group_size)).reshape(layers, experts)
    from_node_order = np.argsort(to_node_order, axis=1)  # inverse permutation

    # 2. Replicate experts within each node (one row per layer and node).
    node_load = np.take_along_axis(load, from_node_order, axis=1).reshape(-1, per_node)
    slot_expert, rank, count = _replicate(node_load, slots_per_node)

    # 3. Pack each node's replicas onto its GPUs, then place them GPU-major.
    slot_load = np.take_along_axis(node_load / count, slot_expert, axis=1)
    gpu, position = _balanced_packing(slot_load, gpus // nodes)
    target = gpu * (slots // gpus) + position
    placed_expert = np.empty_like(slot_expert)
    placed_rank = np.empty_like(rank)
    np.put_along_axis(placed_expert, target, slot_expert, axis=1)
    np.put_along_axis(placed_rank, target, rank, axis=1)

    node_offset = (np.arange(nodes, dtype=np.int64) * per_node)[None, :, None]
    in_node_order = (placed_expert.reshape(layers, nodes, -1) + node_offset).reshape(layers, -1)
    phy2log = np.take_along_axis(from_node_order, in_node_order, axis=1)
    replicas = np.take_along_axis(count.reshape(layers, experts), to_node_order, axis=1)
    return phy2log, placed_rank.reshape(layers, slots), replicas


def _balanced_packing(items: FloatArray, packs: int) -> tuple[IntArray, IntArray]:
    """Split each row's items into ``packs`` equal-sized packs with even total weight.

    Greedy: items go heaviest first to the lightest pack that still has room.
    Returns ``(pack, position)`` per item: its pack and its index within the pack.
    With one item per pack, item ``i`` simply goes to pack ``i``.
    """
    rows, count = items.shape
    capacity = count // packs
    if capacity == 1:
        return (
            np.tile(np.arange(count, dtype=np.int64), (rows, 1)),
            np.zeros((rows, count), dtype=np.int64),
        )
    order = np.argsort(-items, axis=1, kind="stable")
    pack = np.empty((rows, count), dtype=np.int64)
    position = np.empty((rows, count), dtype=np.int64)
    pack_weight = np.zeros((rows, packs))
    pack_size = np.zeros((rows, packs), dtype=np.int64)
    row = np.arange(rows)
    for k in range(count):
        item = order[:, k]
        chosen = np.argmin(np.where(pack_size < capacity, pack_weight, np.inf), axis=1)
        pack[row, item] = chosen
        position[row, item] = pack_size[row, chosen]
        pack_weight[row, chosen] += items[row, item]
        pack_size[row, chosen] += 1
    return pack, position


def _replicate(load: FloatArray, slots: int) -> tuple[IntArray, IntArray, IntArray]:
    """Give each row's experts ``slots`` replicas in all, minimising the heaviest replica.

    Slot ``i < experts`` holds expert ``i``; each further slot goes to the expert
    whose per-replica load is currently highest. Returns ``(slot_expert,
    replica_rank, count)``.
    """
    rows, experts = load.shape
    slot_expert = np.empty((rows, slots), dtype=np.int64)
    slot_expert[:, :experts] = np.arange(experts)
    rank = np.zeros((rows, slots), dtype=np.int64)
    count = np.ones((rows, experts), dtype=np.int64)
    row = np.arange(rows)
    for slot in range(experts, slots):
        busiest = np.argmax(load / count, axis=1)
        slot_expert[:, slot] = busiest
        rank[:, slot] = count[row, busiest]
        count[row, busiest] += 1
    return slot_expert, rank, count


def _check_positive(name: str, value: object) -> None:
    """Raise SpecError unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise SpecError(f"{name}={value!r} must be a positive integer")


def _check_weight(weight: np.ndarray) -> FloatArray:
    """Return ``weight`` as a float array, or raise SpecError if it is not a valid load."""
    try:
        load = np.asarray(weight, dtype=np.float64)
    except (TypeError, ValueError):
        raise SpecError(f"weight={weight!r} must be a numeric (layers, experts) array") from None
    if load.ndim != 2 or load.size == 0:
        raise SpecError(
            f"weight has shape {load.shape}; it must be a non-empty (layers, experts) array"
        )
    if not np.isfinite(load).all() or (load < 0).any():
        bad = load[~np.isfinite(load) | (load < 0)][0]
        raise SpecError(f"weight contains {bad}; every load must be finite and non-negative")
    return load
