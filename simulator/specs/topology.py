"""Cluster topology: GPUs in scale-up (NVLink) domains, one NIC per GPU, one scale-out switch.

`Topology.build` makes the graph, `Topology.place` puts each instance's ranks on GPUs, and the
resulting `Placement` answers the two bandwidth questions the cost model and the simulation ask:
how fast an instance's all-to-all runs, and how fast KV moves from a prefill to a decode instance.

Graph nodes are strings: ``gpu{i}``, ``nvswitch{d}``, ``nic{i}`` and ``spine``, each with a
``kind`` attribute (gpu / nvswitch / nic / spine) and, except the spine, the ``domain`` it sits
in. Edges carry ``gb_s``, the one-direction bandwidth of the link per GPU:
gpu-nvswitch at the scale-up rate, gpu-nic and nic-spine at the NIC rate. The graph is kept as
plain dicts (`Topology.nodes`, `Topology.links`); `Topology.graph` turns it into a networkx graph
on first use, so placing and pricing never import networkx.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.specs.errors import SpecError
from simulator.specs.hardware import HardwareSpec

if TYPE_CHECKING:
    import networkx as nx

SPINE = "spine"
"""Name of the one scale-out switch node that connects every NIC."""


def _gpu(i: int) -> str:
    return f"gpu{i}"


def _nic(i: int) -> str:
    return f"nic{i}"


def _nvswitch(d: int) -> str:
    return f"nvswitch{d}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _check_gpus(gpus: object) -> int:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise SpecError(f"gpus={gpus!r} must be a whole number of GPUs >= 1")
    return gpus


def cluster_description(hardware: HardwareSpec, gpus: int) -> str:
    """The cluster in words: "9 x 8-GPU h200 nodes (72 GPUs)", "1 x gb300 NVL72 rack (72 GPUs)".

    Domains of more than 8 GPUs are called racks (NVL<size>), smaller ones nodes; a last,
    partly used domain is named with the GPUs it contributes.
    """
    gpus = _check_gpus(gpus)
    size = hardware.scaleup_domain
    name = hardware.name
    if size == 1:
        return f"{gpus} x {name} node{'s' if gpus > 1 else ''} ({_plural(gpus, 'device')})"
    kind = "rack" if size > 8 else "node"
    unit = f"{name} NVL{size} rack" if size > 8 else f"{size}-GPU {name} node"
    full, rest = divmod(gpus, size)
    parts = []
    if full:
        parts.append(f"{full} x {unit}{'s' if full > 1 else ''}")
    if rest:
        parts.append(f"1 x {kind if full else unit} using {rest} of {size} GPUs")
    return f"{' + '.join(parts)} ({_plural(gpus, 'GPU')})"


def all_to_all_rate(ranks: int | np.ndarray, in_domain: int | np.ndarray,
                    scaleup_gb_s: float, scaleout_gb_s: float) -> np.ndarray:
    """Per-GPU all-to-all rate (GB/s) of a rank among `ranks`, `in_domain` of them (itself
    included) in its NVLink domain: bytes to its domain peers go over NVLink, to the others over
    its NIC, both at once, so one byte to every peer takes max(peers in / scale-up, peers out /
    scale-out); the rate is peers over that time (the scale-up rate when it has no peer)."""
    n = np.asarray(ranks, dtype=float)
    inside = np.minimum(np.asarray(in_domain, dtype=float), n)
    t = np.maximum((inside - 1) / scaleup_gb_s, (n - inside) / scaleout_gb_s)
    return np.where(t > 0, (n - 1) / np.where(t > 0, t, 1.0), scaleup_gb_s)


@dataclass(frozen=True)
class InstanceRequest:
    """One engine instance to place: a name and how many GPUs (ranks) it needs."""

    name: str
    """Instance name, unique in a layout, e.g. prefill-0."""
    ranks: int
    """GPUs of this instance: its DEP size (or TP size for a dense layout)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"instance name {self.name!r} must be a non-empty string")
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 1:
            raise SpecError(
                f"instance {self.name!r} has ranks={self.ranks!r}; it must be a whole number >= 1"
            )


@dataclass(frozen=True, eq=False)
class Topology:
    """A graph of GPUs, scale-up domains (NVLink switch per domain), one NIC per GPU, and a
    scale-out switch. Build it with `Topology.build`."""

    hardware: HardwareSpec
    """The accelerator kind; its scale-up domain size and link rates shape the graph."""
    nodes: dict[str, dict[str, Any]] = field(repr=False)
    """Node name -> its attributes: ``kind`` (gpu/nvswitch/nic/spine) and ``domain``."""
    links: dict[tuple[str, str], float] = field(repr=False)
    """Each link once, as (node, node) -> its one-direction GB/s per GPU."""

    @classmethod
    def build(cls, hardware: HardwareSpec, gpus: int) -> Topology:
        """`gpus` GPUs in ceil(gpus / scaleup_domain) domains; the last domain may be partial."""
        gpus = _check_gpus(gpus)
        size = hardware.scaleup_domain
        nodes: dict[str, dict[str, Any]] = {SPINE: {"kind": "spine"}}
        links: dict[tuple[str, str], float] = {}
        for d in range(math.ceil(gpus / size)):
            nodes[_nvswitch(d)] = {"kind": "nvswitch", "domain": d}
        for i in range(gpus):
            d = i // size
            nodes[_gpu(i)] = {"kind": "gpu", "domain": d}
            nodes[_nic(i)] = {"kind": "nic", "domain": d}
            links[_gpu(i), _nvswitch(d)] = hardware.scaleup_gb_s
            links[_gpu(i), _nic(i)] = hardware.nic_gb_s
            links[_nic(i), SPINE] = hardware.nic_gb_s
        return cls(hardware=hardware, nodes=nodes, links=links)

    @cached_property
    def graph(self) -> nx.Graph:
        """The same graph as a networkx graph (nodes with their attributes, edges with
        ``gb_s``), built on first use."""
        import networkx as nx

        graph = nx.Graph()
        for name, attrs in self.nodes.items():
            graph.add_node(name, **attrs)
        for (u, v), gb_s in self.links.items():
            graph.add_edge(u, v, gb_s=gb_s)
        return graph

    def _link_gb_s(self, u: str, v: str) -> float:
        """GB/s of the link between nodes `u` and `v`, either way round."""
        gb_s = self.links.get((u, v))
        return float(self.links[v, u] if gb_s is None else gb_s)

    @cached_property
    def gpu_count(self) -> int:
        """GPUs in the cluster."""
        return sum(1 for attrs in self.nodes.values() if attrs["kind"] == "gpu")

    @property
    def domain_count(self) -> int:
        """Scale-up domains in the cluster (the last may be partial)."""
        return math.ceil(self.gpu_count / self.hardware.scaleup_domain)

    def domain_of(self, gpu: int) -> int:
        """The scale-up domain that GPU `gpu` sits in."""
        self._check_gpu(gpu)
        return int(self.nodes[_gpu(gpu)]["domain"])

    def rank_bandwidth(self, gpu_a: int, gpu_b: int) -> float:
        """GB/s one direction between two GPUs: the slowest link on their route, which is the
        NVLink switch inside one domain and NIC -> spine -> NIC between domains."""
        if gpu_a == gpu_b:
            raise SpecError(f"gpu_a and gpu_b are both {gpu_a}; give two different GPUs")
        da, db = self.domain_of(gpu_a), self.domain_of(gpu_b)
        if da == db:
            route = [_gpu(gpu_a), _nvswitch(da), _gpu(gpu_b)]
        else:
            route = [_gpu(gpu_a), _nic(gpu_a), SPINE, _nic(gpu_b), _gpu(gpu_b)]
        return min(self._link_gb_s(u, v) for u, v in pairwise(route))

    def scaleup_gb_s(self, gpu: int) -> float:
        """GB/s one direction from GPU `gpu` into its NVLink switch."""
        return self._link_gb_s(_gpu(gpu), _nvswitch(self.domain_of(gpu)))

    def scaleout_gb_s(self, gpu: int) -> float:
        """GB/s one direction from GPU `gpu` to the spine: the slower of GPU-NIC and NIC-spine."""
        self._check_gpu(gpu)
        return min(self._link_gb_s(_gpu(gpu), _nic(gpu)), self._link_gb_s(_nic(gpu), SPINE))

    def place(self, instances: list[InstanceRequest]) -> Placement:
        """Put each instance's ranks on GPUs, deterministically.

        Larger instances go first (ties by name). An instance that fits in one domain goes to
        the domain with the fewest free GPUs that still holds it (best fit), on its lowest free
        GPUs; otherwise it takes the run of consecutive free GPUs that spans the fewest domains
        (ties: the lowest first GPU). Raises SpecError when the layout needs more GPUs than the
        cluster has, or when free GPUs are too scattered to hold an instance.
        """
        names = [r.name for r in instances]
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise SpecError(f"instance name {name!r} appears more than once; "
                                "give each instance its own name")
            seen.add(name)
        total, gpus = sum(r.ranks for r in instances), self.gpu_count
        if total > gpus:
            wanted = ", ".join(f"{r.name}: {r.ranks}" for r in instances)
            raise SpecError(
                f"layout needs {total} GPUs ({wanted}) but the cluster has {gpus} GPUs "
                f"({self._domains_phrase()}); use at most {gpus} GPUs in total"
            )
        free = [True] * gpus
        placed: dict[str, tuple[int, ...]] = {}
        for request in sorted(instances, key=lambda r: (-r.ranks, r.name)):
            chosen = self._in_one_domain(free, request.ranks) or self._spanning(free, request.ranks)
            if chosen is None:
                raise SpecError(self._fragmented(free, request))
            for g in chosen:
                free[g] = False
            placed[request.name] = chosen
        return Placement(topology=self, gpus={name: placed[name] for name in names})

    def _check_gpu(self, gpu: int) -> None:
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < self.gpu_count:
            raise SpecError(f"GPU {gpu!r} is not in the cluster; valid: 0..{self.gpu_count - 1}")

    def _domain_free(self, free: list[bool]) -> list[list[int]]:
        size = self.hardware.scaleup_domain
        return [
            [g for g in range(d * size, min((d + 1) * size, len(free))) if free[g]]
            for d in range(self.domain_count)
        ]

    def _in_one_domain(self, free: list[bool], ranks: int) -> tuple[int, ...] | None:
        fits = [f for f in self._domain_free(free) if len(f) >= ranks]
        if not fits:
            return None
        best = min(fits, key=len)  # min keeps the first (lowest domain) among equals
        return tuple(best[:ranks])

    def _spanning(self, free: list[bool], ranks: int) -> tuple[int, ...] | None:
        size = self.hardware.scaleup_domain
        best: tuple[int, int] | None = None  # (domains spanned, first GPU)
        run = 0
        for g, is_free in enumerate(free):
            run = run + 1 if is_free else 0
            if run >= ranks:
                start = g - ranks + 1
                spanned = g // size - start // size + 1
                if best is None or spanned < best[0]:
                    best = (spanned, start)
        return None if best is None else tuple(range(best[1], best[1] + ranks))

    def _fragmented(self, free: list[bool], request: InstanceRequest) -> str:
        longest = run = 0
        for is_free in free:
            run = run + 1 if is_free else 0
            longest = max(longest, run)
        most_in_domain = max(len(f) for f in self._domain_free(free))
        size = self.hardware.scaleup_domain
        return (
            f"cannot place {request.name!r} ({request.ranks} GPUs): {sum(free)} GPUs are free "
            f"but fragmented (at most {longest} consecutive, at most {most_in_domain} in one "
            f"{size}-GPU domain); use more GPUs or instance sizes that pack into whole "
            f"{size}-GPU domains"
        )

    def _domains_phrase(self) -> str:
        size = self.hardware.scaleup_domain
        full, rest = divmod(self.gpu_count, size)
        parts = [f"{full} x {size}-GPU domain{'s' if full > 1 else ''}"] if full else []
        if rest:
            parts.append(f"1 x {rest}-GPU domain")
        return " + ".join(parts)


@dataclass(frozen=True)
class Placement:
    """Which GPUs each instance runs on, and the bandwidths that follow from it."""

    topology: Topology
    """The cluster the instances are placed in."""
    gpus: dict[str, tuple[int, ...]]
    """Instance name -> its GPU ids, rank order."""

    def _ranks(self, name: str) -> tuple[int, ...]:
        try:
            return self.gpus[name]
        except KeyError:
            raise SpecError(
                f"unknown instance {name!r}; placed: {', '.join(self.gpus) or 'none'}"
            ) from None

    def _domains_of(self, name: str) -> set[int]:
        return {self.topology.domain_of(g) for g in self._ranks(name)}

    def domains(self, name: str) -> int:
        """How many scale-up domains the instance spans."""
        return len(self._domains_of(name))

    def all_to_all_gb_s(self, name: str) -> float:
        """Effective per-GPU bandwidth (GB/s, one direction) of an all-to-all inside the instance.

        Model: every rank sends the same bytes to each of its peers. Bytes to peers in its own
        domain go over NVLink, bytes to the others over its NIC, both at once, so a rank takes
        max(peers_in / scaleup, peers_out / nic) per byte-per-peer; the slowest rank sets the
        pace and the rate is peers / that time. Inside one domain this is the scale-up rate;
        spanning domains it is NIC-limited. A one-rank instance has no peers and reports the
        scale-up rate (it moves no bytes, so any finite rate gives zero time).
        """
        ranks, topo = self._ranks(name), self.topology
        if len(ranks) == 1:
            return topo.scaleup_gb_s(ranks[0])
        per_domain: dict[int, int] = {}
        for g in ranks:
            d = topo.domain_of(g)
            per_domain[d] = per_domain.get(d, 0) + 1
        return min(float(all_to_all_rate(len(ranks), per_domain[topo.domain_of(g)],
                                         topo.scaleup_gb_s(g), topo.scaleout_gb_s(g)))
                   for g in ranks)

    def transfer_gb_s(self, src: str, dst: str, concurrent: int = 1) -> float:
        """GB/s (one direction) one KV transfer gets from instance `src` to instance `dst`.

        Each transfer goes from one source rank to one destination rank: over NVLink when both
        instances sit in one and the same domain, otherwise over the NICs (the slowest NIC route
        among both instances' ranks). min(source ranks, destination ranks) transfers can run side
        by side on separate links; `concurrent` transfers share those links evenly, and one
        transfer never gets more than one link's rate.
        """
        if isinstance(concurrent, bool) or not isinstance(concurrent, int) or concurrent < 1:
            raise SpecError(f"concurrent={concurrent!r} must be a whole number of transfers >= 1")
        if src == dst:
            raise SpecError(f"KV transfer from {src!r} to itself; give two different instances")
        src_ranks, dst_ranks = self._ranks(src), self._ranks(dst)
        if len(self._domains_of(src) | self._domains_of(dst)) == 1:
            link = self.topology.rank_bandwidth(src_ranks[0], dst_ranks[0])
        else:
            link = min(self.topology.scaleout_gb_s(g) for g in src_ranks + dst_ranks)
        lanes = min(len(src_ranks), len(dst_ranks))
        return link * min(1.0, lanes / concurrent)
