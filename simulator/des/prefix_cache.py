"""Prefix cache of one instance: an LRU of fixed-size KV blocks named by content hash ids."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 512
"""Tokens per hashed prefix block (the Mooncake trace's block size)."""


class BlockLRU:
    """Least-recently-used set of block ids, at most `capacity` blocks."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(int(capacity), 0)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def hits(self, blocks: Sequence[int]) -> int:
        """Leading blocks of a prompt already cached (a prefix cache stops at the first miss).

        Looking up refreshes the hit blocks."""
        n = 0
        for b in blocks:
            if b not in self._blocks:
                break
            self._blocks.move_to_end(b)
            n += 1
        return n

    def insert(self, blocks: Sequence[int]) -> None:
        """Cache a prompt's blocks (most recent last), evicting the least recently used."""
        if not self.capacity:
            return
        for b in blocks:
            self._blocks[b] = None
            self._blocks.move_to_end(b)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)


def cached_tokens(hit_blocks: int, input_len: int, block_tokens: int = BLOCK_TOKENS) -> int:
    """Prompt tokens served from cache: whole hit blocks, but the last prompt token is always
    computed (the engine needs its logits)."""
    return max(min(hit_blocks * block_tokens, input_len - 1), 0)
