"""The proxy's guess of what each instance holds in its prefix cache, from where it sent prompts.

This is the "approximate" mode of Dynamo's KV router: no KV events come back from the engines;
the proxy remembers, per instance, the prompts it routed there and predicts that instance's
cache from them. A prompt is cut into chunks of CHUNK_CHARS characters and each whole chunk gets
a chained key (chunk i's key hashes chunk i's text with chunk i-1's key, so it stands for the
whole prefix 0..i, as vLLM's block hashes do). An instance holds a prefix of a new prompt as far
as its leading keys are all in that instance's index.

Units are characters, not the engine's tokens: the proxy sees text, and tokenizing it would
need the model's tokenizer and chat template in the proxy, on every request, to match block
hashes the engines do not publish without KV events anyway. Characters are enough for a
router: it only compares candidates for one request, and the characters-per-token ratio of a
prompt is the same on every candidate.

Memory stays bounded for a long-running proxy: each instance's index is an LRU of at most
INDEX_KEYS keys (least recently routed forgotten first), about 120 bytes a key, so about 30 MiB
per instance when full. At CHUNK_CHARS = 64 (16 tokens or so) that is 16 M characters,
about 4 M tokens: the order of one large instance's KV cache.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

CHUNK_CHARS = 64
"""Characters per chunk: a few engine tokens short of a KV block, so that a cached prefix is
found to within a block."""
INDEX_KEYS = 262_144
"""Chunk keys one instance's index holds at most."""


def chunk_keys(text: str, chunk_chars: int = CHUNK_CHARS) -> list[int]:
    """Chained keys of the whole chunks of `text` (a trailing partial chunk has none, as an
    engine caches whole blocks only)."""
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars={chunk_chars} must be >= 1")
    keys: list[int] = []
    previous = b""
    for start in range(0, len(text) - chunk_chars + 1, chunk_chars):
        digest = hashlib.blake2b(previous + text[start:start + chunk_chars].encode(),
                                 digest_size=8).digest()
        keys.append(int.from_bytes(digest, "big"))
        previous = digest
    return keys


class PrefixIndex:
    """One instance's predicted prefix cache: an LRU of chunk keys."""

    def __init__(self, capacity: int = INDEX_KEYS) -> None:
        if capacity < 1:
            raise ValueError(f"prefix index capacity={capacity} must be >= 1")
        self.capacity = capacity
        self._keys: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def matched(self, keys: Sequence[int]) -> int:
        """How many leading chunks of a prompt (its `keys`) the instance is predicted to hold.
        Looking does not refresh: only routing a prompt here does."""
        n = 0
        for key in keys:
            if key not in self._keys:
                break
            n += 1
        return n

    def add(self, keys: Sequence[int]) -> None:
        """A prompt was routed here: its chunks are now the most recently used. They go in last
        chunk first, so that the first chunk is the freshest and eviction eats a prompt from
        its tail, as vLLM frees a finished request's blocks tail first."""
        for key in reversed(keys):
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)
