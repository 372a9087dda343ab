"""Prefix cache of one DP rank: an LRU of KV blocks named by content hash ids, held in runs.

vLLM keeps the blocks of finished prompts in its free block pool and evicts them, least recently
used first, only when a new allocation needs the space; so the cache of a rank holds at most what
its KV memory leaves after the requests running there. A rank's blocks are kept here as runs of
consecutive ids, {first id: blocks cached}: an agent's turn extends the previous turn's run, so a
500K-token prompt costs a few dict entries, not 8,000. A block id names a block *and* its prefix
(the traces' hash ids are chained), so a run is matched from its first id.

Eviction trims a run from its tail (a later block is useless without the earlier ones, and vLLM
frees a request's blocks tail first), and the runs of one prompt are refreshed first-run-last, so
a shared system prompt outlives the tails behind it.

`HostTier` is the optional second tier in host memory (vLLM's KV offloading connector, LMCache):
every block computed is stored there too, and a prompt whose blocks fell out of HBM but are in
host memory loads them over the host link instead of computing them.

`Holders` indexes, for a role's prefix caches together, which ranks hold a run starting at a
given block: a rank whose cache lacks a prompt's first block has no hit for it, so a router
looks only into the ranks that hold it instead of into every rank's cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from simulator.des.sessions import Runs

BLOCK_TOKENS = 512
"""Tokens per hashed prefix block of the Mooncake traces (AgentX traces: 64, from the trace)."""


class Holders:
    """Block id -> the ranks whose caches hold a run starting there, over every rank
    registered (one index per role: its instances' ranks and both tiers of each)."""

    def __init__(self) -> None:
        self.ranks: dict[int, dict[int, int]] = {}
        """Block id -> {rank key: tiers holding it}."""
        self.owners: list[tuple[RankCaches, int]] = []
        """Rank key -> (its instance's caches, the rank there)."""

    def register(self, caches: RankCaches, ranks: int) -> int:
        """Give an instance's `ranks` keys; returns the first (rank r's key is it + r)."""
        base = len(self.owners)
        self.owners.extend((caches, r) for r in range(ranks))
        return base

    def add(self, block: int, key: int) -> None:
        held = self.ranks.get(block)
        if held is None:
            self.ranks[block] = {key: 1}
        else:
            held[key] = held.get(key, 0) + 1

    def drop(self, block: int, key: int) -> None:
        held = self.ranks[block]
        if held[key] > 1:
            held[key] -= 1
            return
        del held[key]
        if not held:
            del self.ranks[block]

    def of(self, runs: Runs) -> list[tuple[RankCaches, int]]:
        """(caches, rank) of the ranks that may hit `runs`: those holding its first block."""
        if not runs:
            return []
        held = self.ranks.get(runs[0][0])
        if not held:
            return []
        owners = self.owners
        return [owners[k] for k in held]


class BlockLRU:
    """Least-recently-used runs of block ids, at most `capacity` blocks."""

    def __init__(self, capacity: int, holders: Holders | None = None, key: int = 0) -> None:
        self._capacity = max(int(capacity), 0)
        self._runs: OrderedDict[int, int] = OrderedDict()
        self.blocks = 0
        """Blocks cached."""
        self._holders, self._key = holders, key
        """The index told of every run start added or evicted, and this cache's rank key."""

    def __len__(self) -> int:
        return self.blocks

    @property
    def capacity(self) -> int:
        return self._capacity

    @capacity.setter
    def capacity(self, blocks: int) -> None:
        """Shrinking evicts at once."""
        self._capacity = max(int(blocks), 0)
        self._evict()

    def peek(self, runs: Runs) -> int:
        """Leading blocks of a prompt cached here (a prefix cache stops at the first miss);
        changes nothing (what a router asks)."""
        n = 0
        for start, count in runs:
            held = self._runs.get(start, 0)
            n += min(held, count)
            if held < count:
                break
        return n

    def hits(self, runs: Runs) -> int:
        """Like `peek`, and the hit runs become the most recently used."""
        n = 0
        touched = []
        for start, count in runs:
            held = self._runs.get(start, 0)
            if held:
                touched.append(start)
            n += min(held, count)
            if held < count:
                break
        for start in reversed(touched):
            self._runs.move_to_end(start)
        return n

    def insert(self, runs: Runs) -> None:
        """Cache a prompt's blocks as the most recently used, evicting the least recently
        used (tails first) beyond capacity."""
        if not self._capacity:
            return
        for start, count in reversed(runs):
            held = self._runs.get(start, 0)
            if count > held:
                self.blocks += count - held
                self._runs[start] = count
                if not held and self._holders is not None:
                    self._holders.add(start, self._key)
            self._runs.move_to_end(start)
        self._evict()

    def _evict(self) -> None:
        while self.blocks > self._capacity and self._runs:
            start, held = next(iter(self._runs.items()))
            over = self.blocks - self._capacity
            if held <= over:
                del self._runs[start]
                self.blocks -= held
                if self._holders is not None:
                    self._holders.drop(start, self._key)
            else:
                self._runs[start] = held - over
                self.blocks -= over


def cached_tokens(hit_blocks: int, input_len: int, block_tokens: int = BLOCK_TOKENS) -> int:
    """Prompt tokens served from cache: whole hit blocks, but the last prompt token is always
    computed (the engine needs its logits)."""
    return max(min(hit_blocks * block_tokens, input_len - 1), 0)


def rate_cached_tokens(hit_rate: float, input_len: float) -> int:
    """Prompt tokens served from cache for a request that carries no block ids: the workload's
    `prefix_hit_rate` share, but the last prompt token is always computed."""
    return min(int(hit_rate * input_len), int(input_len) - 1)


class RankCaches:
    """The prefix caches of an instance's DP ranks: HBM, and the host tier when there is one.

    `free_blocks(rank)` says how many blocks the rank's KV memory leaves after the requests
    running there; the HBM cache is held to it at every lookup and insert. `holders` is the
    index of run starts these ranks share with the other instances of their role (default: one
    of their own).
    """

    def __init__(self, ranks: int, free_blocks: Callable[[int], int], host_blocks: int = 0,
                 block_tokens: int = BLOCK_TOKENS, load_s_per_block: float = 0.0,
                 holders: Holders | None = None) -> None:
        self.free_blocks, self.block_tokens = free_blocks, block_tokens
        self.holders = Holders() if holders is None else holders
        base = self.holders.register(self, ranks)
        self.hbm = [BlockLRU(free_blocks(r), self.holders, base + r) for r in range(ranks)]
        self.host = ([BlockLRU(host_blocks, self.holders, base + r) for r in range(ranks)]
                     if host_blocks > 0 else None)
        self.load_s_per_block = load_s_per_block
        """Seconds one block takes over the rank's host link."""
        self._link_free = [0.0] * ranks

    def load_done(self, rank: int, blocks: int, now: float) -> float:
        """When `blocks` from the host tier, asked for at `now`, are in HBM: loads on one rank's
        link go one after another."""
        start = max(now, self._link_free[rank])
        self._link_free[rank] = start + blocks * self.load_s_per_block
        return self._link_free[rank]

    def peek(self, rank: int, runs: Runs) -> int:
        """Leading blocks of a prompt the rank could serve without computing them."""
        hbm = self.hbm[rank].peek(runs)
        return max(hbm, self.host[rank].peek(runs)) if self.host is not None else hbm

    def lookup(self, rank: int, runs: Runs) -> tuple[int, int]:
        """(blocks hit in HBM, further leading blocks hit in the host tier), refreshing both."""
        hbm = self.hbm[rank]
        hbm.capacity = self.free_blocks(rank)
        n = hbm.hits(runs)
        if self.host is None:
            return n, 0
        return n, max(self.host[rank].hits(runs) - n, 0)

    def insert(self, rank: int, runs: Runs) -> None:
        """A prompt's blocks were computed (or loaded) on the rank."""
        hbm = self.hbm[rank]
        hbm.capacity = self.free_blocks(rank)
        hbm.insert(runs)
        if self.host is not None:
            self.host[rank].insert(runs)
