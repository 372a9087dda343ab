"""Topology: graph shape, placement rules, and the bandwidths a placement implies."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware
from simulator.specs.topology import InstanceRequest, Topology, cluster_description

H200 = load_hardware("h200")  # 8-GPU nodes, NVLink 450 GB/s, NIC 50 GB/s per GPU
GB300 = load_hardware("gb300")  # 72-GPU NVL72 rack, NVLink 900 GB/s, NIC 100 GB/s per GPU


def req(**ranks: int) -> list[InstanceRequest]:
    """Requests from keyword arguments, e.g. req(a=8, b=16); `_` in a name becomes `-`."""
    return [InstanceRequest(name.replace("_", "-"), n) for name, n in ranks.items()]


def test_build_makes_one_switch_per_domain_and_one_nic_per_gpu() -> None:
    topo = Topology.build(H200, 20)
    kinds = [kind for _, kind in topo.graph.nodes(data="kind")]
    assert kinds.count("gpu") == 20
    assert kinds.count("nic") == 20
    assert kinds.count("nvswitch") == 3  # ceil(20 / 8): the last node is partial
    assert kinds.count("spine") == 1
    assert topo.gpu_count == 20
    assert topo.domain_count == 3
    assert [topo.domain_of(g) for g in (0, 7, 8, 19)] == [0, 0, 1, 2]
    assert all("gb_s" in data for _, _, data in topo.graph.edges(data=True))


def test_rank_bandwidth_is_nvlink_inside_a_node_and_nic_between_nodes() -> None:
    topo = Topology.build(H200, 16)
    assert topo.rank_bandwidth(0, 7) == H200.scaleup_gb_s
    assert topo.rank_bandwidth(7, 8) == H200.nic_gb_s
    with pytest.raises(SpecError, match=r"16 is not in the cluster; valid: 0\.\.15"):
        topo.rank_bandwidth(0, 16)
    with pytest.raises(SpecError, match="both 3"):
        topo.rank_bandwidth(3, 3)


def test_dep8_on_h200_stays_in_one_node_with_scaleup_all_to_all() -> None:
    placement = Topology.build(H200, 16).place(req(decode_0=8))
    assert placement.gpus["decode-0"] == tuple(range(8))
    assert placement.domains("decode-0") == 1
    assert placement.all_to_all_gb_s("decode-0") == H200.scaleup_gb_s


def test_dep16_on_h200_spans_two_nodes_and_is_nic_limited() -> None:
    placement = Topology.build(H200, 16).place(req(decode_0=16))
    assert placement.domains("decode-0") == 2
    rate = placement.all_to_all_gb_s("decode-0")
    # Each rank: 7 peers over NVLink (7/450) and 8 over the NIC (8/50, the bottleneck).
    assert rate == pytest.approx(15 / (8 / 50))
    assert H200.nic_gb_s < rate < H200.scaleup_gb_s


def test_dep32_on_gb300_stays_in_the_rack() -> None:
    placement = Topology.build(GB300, 72).place(req(prefill_0=8, decode_0=32))
    assert placement.domains("decode-0") == 1
    assert placement.all_to_all_gb_s("decode-0") == GB300.scaleup_gb_s
    # KV between two instances of one rack moves over NVLink.
    assert placement.transfer_gb_s("prefill-0", "decode-0") == GB300.scaleup_gb_s


def test_one_rank_per_domain_hardware_goes_over_the_nic() -> None:
    cpu = load_hardware("cpu")
    placement = Topology.build(cpu, 2).place(req(a=2))
    assert placement.domains("a") == 2
    assert placement.all_to_all_gb_s("a") == cpu.nic_gb_s
    single = Topology.build(cpu, 1).place(req(a=1))
    assert single.all_to_all_gb_s("a") == cpu.scaleup_gb_s  # no peers: finite, moot


def test_kv_transfer_across_h200_nodes_uses_the_nic_and_is_shared() -> None:
    placement = Topology.build(H200, 16).place(req(prefill_0=8, decode_0=8))
    assert placement.domains("prefill-0") == placement.domains("decode-0") == 1
    assert set(placement.gpus["prefill-0"]).isdisjoint(placement.gpus["decode-0"])
    one = placement.transfer_gb_s("prefill-0", "decode-0")
    assert one == H200.nic_gb_s
    # Eight rank pairs run side by side; beyond eight transfers they share the links.
    assert placement.transfer_gb_s("prefill-0", "decode-0", concurrent=8) == H200.nic_gb_s
    assert placement.transfer_gb_s("prefill-0", "decode-0", concurrent=16) == H200.nic_gb_s / 2
    assert placement.transfer_gb_s("prefill-0", "decode-0", concurrent=32) == H200.nic_gb_s / 4


def test_kv_transfer_lanes_are_the_smaller_instance() -> None:
    placement = Topology.build(H200, 24).place(req(prefill_0=4, decode_0=16))
    assert placement.transfer_gb_s("prefill-0", "decode-0", concurrent=8) == H200.nic_gb_s / 2


def test_larger_instances_first_and_best_fit_domain() -> None:
    placement = Topology.build(H200, 24).place(req(small=2, mid=6, big=16))
    assert placement.gpus["big"] == tuple(range(16))  # largest first, lowest domains
    assert placement.gpus["mid"] == tuple(range(16, 22))
    assert placement.gpus["small"] == (22, 23)  # best fit: the node with 2 free GPUs

    # Best fit leaves a whole node free for a later 8-GPU instance.
    placement = Topology.build(H200, 16).place(req(a=6, b=2, c=8))
    assert placement.gpus["c"] == tuple(range(8))
    assert placement.gpus["a"] == tuple(range(8, 14))
    assert placement.gpus["b"] == (14, 15)


def test_spanning_instance_takes_the_fewest_domains() -> None:
    # Three 11-GPU instances on five 8-GPU nodes: a takes 0..10, b 11..21. The first free run
    # for c (22..32) would touch three nodes; 24..34 touches two, so c goes there.
    placement = Topology.build(H200, 40).place(req(a=11, b=11, c=11))
    assert placement.gpus["a"] == tuple(range(11))
    assert placement.gpus["b"] == tuple(range(11, 22))
    assert placement.gpus["c"] == tuple(range(24, 35))
    assert placement.domains("c") == 2


def test_placement_is_deterministic_and_independent_of_request_order() -> None:
    topo = Topology.build(H200, 64)
    layout = req(prefill_0=8, prefill_1=8, prefill_2=4, decode_0=16, decode_1=16, decode_2=4)
    first = topo.place(layout).gpus
    assert topo.place(layout).gpus == first
    assert topo.place(list(reversed(layout))).gpus == first
    assert list(topo.place(layout).gpus) == [r.name for r in layout]  # keeps the caller's order
    # Ties in size break by name: decode-0 before decode-1, prefill-0 before prefill-1.
    assert first["decode-0"] < first["decode-1"]
    assert first["prefill-0"] < first["prefill-1"]


def test_overfull_layout_names_the_numbers() -> None:
    topo = Topology.build(GB300, 72)
    layout = req(prefill_0=8, prefill_1=8, prefill_2=8, prefill_3=8, decode_0=48)
    with pytest.raises(SpecError) as err:
        topo.place(layout)
    message = str(err.value)
    assert message.startswith("layout needs 80 GPUs (prefill-0: 8, prefill-1: 8,")
    assert "decode-0: 48) but the cluster has 72 GPUs (1 x 72-GPU domain)" in message


def test_fragmentation_names_the_instance() -> None:
    # Four 6-GPU instances in three 8-GPU nodes: 24 GPUs suffice in number, but the first
    # three each take a node and leave 2 + 2 + 2 scattered GPUs for the fourth.
    topo = Topology.build(H200, 24)
    with pytest.raises(SpecError, match=r"cannot place 'd' \(6 GPUs\): 6 GPUs are free") as err:
        topo.place(req(a=6, b=6, c=6, d=6))
    assert "at most 2 consecutive" in str(err.value)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (lambda: InstanceRequest("a", 0), "ranks=0"),
        (lambda: InstanceRequest("", 8), "non-empty"),
        (lambda: Topology.build(H200, 0), "gpus=0"),
        (lambda: Topology.build(H200, 16).place(req(a=8) + req(a=4)), "'a' appears more"),
        (lambda: Topology.build(H200, 16).place(req(a=8)).domains("b"), "unknown instance 'b'"),
        (lambda: Topology.build(H200, 16).place(req(a=8, b=8)).transfer_gb_s("a", "b", 0),
         "concurrent=0"),
        (lambda: Topology.build(H200, 16).place(req(a=8)).transfer_gb_s("a", "a"), "itself"),
    ],
)
def test_bad_input_raises_spec_error(bad: Callable[[], object], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        bad()


@pytest.mark.parametrize(
    ("hardware", "gpus", "text"),
    [
        ("h200", 72, "9 x 8-GPU h200 nodes (72 GPUs)"),
        ("h200", 20, "2 x 8-GPU h200 nodes + 1 x node using 4 of 8 GPUs (20 GPUs)"),
        ("gb300", 72, "1 x gb300 NVL72 rack (72 GPUs)"),
        ("gb300", 32, "1 x gb300 NVL72 rack using 32 of 72 GPUs (32 GPUs)"),
        ("cpu", 2, "2 x cpu nodes (2 devices)"),
    ],
)
def test_cluster_description(hardware: str, gpus: int, text: str) -> None:
    assert cluster_description(load_hardware(hardware), gpus) == text
