"""Operation prices remembered per point, so that a step the step memo has not seen is cheap.

A step prices a dozen operations (GEMMs, attention modules, the MoE, the exchange), each through
`Calibration`: a table lookup, an interpolation and a roofline, ~0.1 ms a call. In a run the
same operations come back with the same fixed arguments (shapes, dtypes, the instance) and a
few recurring values of their varying ones: the step memo (`simulator.des.pricing`) rounds every
rank's row to 6 significant bits, so a new step signature is mostly made of rows, and so of
operation points, that earlier steps priced. `CachedCalibration` stands in for a `Calibration`:
per operation and fixed arguments it remembers the price of each point (one value of each
varying argument), and prices the points it has not seen with the wrapped calibration in one
vectorised call. A price is the wrapped calibration's price of that point, bit for bit, so a
step priced through it is the step priced directly.

Provenance: a point carries the source of the call that priced it, which is the least
trustworthy of the points priced together (ranks of one step); a query reports the least
trustworthy of its points: never better than direct pricing, worse only where a point was first
priced beside a less trustworthy one.

It is not an interpolating grid: the step memo's rounding is the only approximation, because
the cost model's own prices are not smooth enough to interpolate within 0.5 % everywhere (the
DeepSeek-V4 prefill attention module jumps by up to 2x within 2 % of context where a measured
table's range ends; a sparse MoE table by 30 % at 32 tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from operator import itemgetter
from typing import Any

import numpy as np
from pydantic import BaseModel

from simulator.calibration import Calibration, Priced
from simulator.calibration.grid import SOURCES

MAX_POINTS = 500_000
"""Points one CachedCalibration keeps over all its operations (~100 bytes each); past it, or
past MAX_OBJECTS object arguments seen, it starts afresh."""

MAX_OBJECTS = 10_000

_SCALARS = frozenset((int, float, str, bool, type(None)))
"""Types a cheap key takes as they are."""

_BY_VALUE = _SCALARS | {tuple}
"""Types a cheap key takes as they are where they hash (a tuple of scalars is equal to its
content key, `_fixed` of it)."""

VARYING: dict[str, tuple[int, ...]] = {
    "gemm": (0,),
    "gemm_chain": (0,),
    "moe": (0,),
    "moe_wideep": (0,),
    "mega_moe": (0,),
    "mhc": (0,),
    "all_to_all": (0,),
    "allreduce": (0,),
    "collective": (1,),
    "attention_context": (0, 1),
    "attention_generation": (0, 1),
    "mla_context": (0, 1),
    "mla_generation": (0, 1),
    "gdn": (2, 3),
    "dsa_module": (2, 3, 4),
    "dsv4_module": (3, 4, 5),
    "dsv41_module": (3, 4, 5),
    "dsv41_indexer": (3, 4, 5),
    "dsv41_attention": (3, 4, 5),
}
"""Operation (a Calibration method) -> positions of its varying arguments (per-point values:
tokens, batch, context, bytes); every other argument is fixed for a grid. Methods not listed
are passed through to the wrapped calibration."""


def _past_at_most(args: tuple[Any, ...], most: float) -> tuple[Any, ...]:
    """(kind, context, inst, batch, new, past) with `past` clamped to `most` tokens."""
    return (*args[:5], np.minimum(np.asarray(args[5], dtype=float), most))


def _window_only(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """dsv4_module(kind, context, inst, batch, new, past) of a sliding-window-only layer
    (ratio 0) reads its window whatever the context: dsv4_module clamps `past` to it first, so
    clamping it here gives the same price and lets every longer context share one point."""
    kind, inst = args[0], args[2]
    if getattr(kind, "ratio", None) != 0 or len(args) < 6:
        return args
    return _past_at_most(args, inst.model.sliding_window)


def _v41_reach(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """dsv41_module or dsv41_attention(kind, context, inst, batch, new, past) reads no more
    once the context covers what the layer attends to: a window-only layer its window, and in
    decode a layer reading records its window and top-k (`reads` x top-k tokens). Past that,
    every context is one point (the same price)."""
    kind, context, inst = args[0], args[1], args[2]
    m = inst.model
    reach = (m.sliding_window if not kind.reads
             else None if context else max(kind.reads * m.sparse_topk, m.sliding_window))
    return args if reach is None else _past_at_most(args, reach)


_READERS: dict[int, Any] = {}
"""A V4.1 layer kind's `reads` -> the first kind seen that reads so (see _v41_kernel)."""


def _v41_kernel(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """dsv41_attention prices the fused kernel by what the layer reads: its window and its
    source's records (`reads`, with the record and window bytes every CSA2 kind shares), not by
    whether the layer stores or scores them; every kind of the same `reads` is one point."""
    kind, *rest = _v41_reach(args)
    return (_READERS.setdefault(kind.reads, kind), *rest)


def _candidates_reach(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """dsv41_indexer(kind, context, inst, batch, new, past) of a re-indexing layer scores at
    most `candidate_pool` keys: once `past` holds that many records (`reads` x the pool
    tokens), every new token scores the whole pool and reads as many keys, so every longer
    past is one point (the same price, bit for bit: the pricing sees `past` only through
    min(keys, pool) where the new tokens only add keys)."""
    kind, inst = args[0], args[2]
    if kind.index != "candidates" or len(args) < 6:
        return args
    return _past_at_most(args, float(kind.reads * inst.model.candidate_pool))


SAME_PRICE: dict[str, Callable[[tuple[Any, ...]], tuple[Any, ...]]] = {
    "dsv4_module": _window_only, "dsv41_module": _v41_reach, "dsv41_attention": _v41_kernel,
    "dsv41_indexer": _candidates_reach}
"""Operation -> its arguments with values it prices alike made equal (what the operation
itself does first), so that they are one point here."""


def round_bits(x: Any, bits: int) -> Any:
    """`x` (>= 0, below 2^900; an array or one float) rounded to nearest at `bits` significant
    bits, ties to even.

    Veltkamp's split in three float operations: c = x (2^(53 - bits) + 1) holds x shifted
    up, c - (c - x) its leading `bits` bits (the same values as rounding frexp's mantissa;
    tests/simulator/test_price_cache.py checks them against it)."""
    c = x * float((1 << (53 - bits)) + 1)
    return c - (c - x)


LATTICE_AHEAD = {"dsv41_indexer": (1, 2), "dsv4_module": (1, 2), "dsa_module": (0, 2)}
"""Operation -> (position of its prefill flag, index among its varying arguments of the
context): operations whose decode price grows with the context without bound and costs a
fraction of a millisecond a call. A decode step's context creeps up one value of the step
memo's lattice at a time (`round_bits`), so when such a decode point is
new, the price cache prices it with the next LATTICE_UP and the previous LATTICE_DOWN lattice
contexts (same batch and tokens) in the same vectorised call: one call for a run of steps
instead of one each. Each price is still the wrapped calibration's of its point, bit for bit
(a point priced among others is the point priced alone)."""

LATTICE_UP = 32
LATTICE_DOWN = 8


def lattice_around(x: float, bits: int, up: int, down: int) -> list[float]:
    """The `down` values below and `up` above `x` on the lattice of numbers with `bits`
    significant bits (x itself on it and positive), nearest first in each direction, those
    below stopping at 1. Exact in floats: each is x plus or minus multiples of powers of two."""
    out = []
    v = x
    for _ in range(up):
        e = math.frexp(v)[1]  # v = m 2^e, m in [0.5, 1): its binade steps by 2^(e - bits)
        v += math.ldexp(1.0, e - bits)
        out.append(v)
    v = x
    for _ in range(down):
        m, e = math.frexp(v)
        v -= math.ldexp(1.0, e - bits - (1 if m == 0.5 else 0))  # the binade below at 2^k
        if v < 1.0:
            break
        out.append(v)
    return out


def _fixed(value: Any) -> Any:
    """A hashable stand-in for a fixed argument, by content (dataclasses by their fields,
    pydantic models by their JSON, dicts sorted)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _fixed(v)) for k, v in value.items()))
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *(_fixed(getattr(value, f.name)) for f in fields(value)))
    if isinstance(value, BaseModel):
        return (type(value).__name__, value.model_dump_json())
    if isinstance(value, list | tuple):
        return tuple(_fixed(v) for v in value)
    if isinstance(value, np.ndarray):
        return (value.shape, value.tobytes())
    return value


def _one_point(args: tuple[Any, ...], varying: tuple[int, ...]
               ) -> tuple[bytes, tuple[int, ...]] | None:
    """The key of a call whose varying arguments are one point each (one-element arrays or
    numbers): their float64 bytes in order, as `CachedCalibration._price` keys a point; and
    the shape of the price, as that path gives it (the arguments broadcast, at least 1-d).
    None for more points."""
    parts = []
    ndim = 1
    for i in varying:
        v = args[i]
        if type(v) is np.ndarray:
            if v.size != 1:
                return None
            ndim = max(ndim, v.ndim)
            parts.append(v.astype(float, copy=False).tobytes())
        elif type(v) is float or type(v) is int:
            parts.append(np.float64(v).tobytes())
        else:
            return None
    return b"".join(parts), (1,) * ndim


def _frozen(ms: float, code: int, table: str) -> Priced:
    """The price of one point in shape (1,), its arrays read-only (shared by the calls)."""
    values, codes = np.array([ms]), np.array([code])
    values.setflags(write=False)
    codes.setflags(write=False)
    return Priced(values, SOURCES[code], table, codes)


class _Points:
    """The priced points of one operation with its fixed arguments."""

    def __init__(self) -> None:
        self.index: dict[bytes, int] = {}
        self.ms: list[float] = []
        self.code: list[int] = []
        self.table: list[str] = []
        self.one: dict[int, Priced] = {}
        """Point index -> its price as a one-point call of shape (1,) gets it (read-only
        arrays: every such call shares it)."""
        self.none = False
        """The operation answered None (no table for it): it does for every point."""

    def add(self, keys: list[bytes], ms: np.ndarray, codes: np.ndarray, table: str) -> None:
        base = len(self.ms)
        for i, k in enumerate(keys):
            self.index[k] = base + i
        self.ms.extend(ms.tolist())
        self.code.extend(codes.tolist())
        self.table.extend([table] * len(keys))


class CachedCalibration:
    """A Calibration whose listed operations remember their prices per point (module doc)."""

    def __init__(self, calibration: Calibration, lattice_bits: int | None = None) -> None:
        self.calibration = calibration
        self.lattice_bits = lattice_bits
        """Significant bits of the step memo's lattice of contexts, for the points priced
        ahead (LATTICE_AHEAD); None: none are."""
        self._memo: dict[tuple[Any, ...], _Points] = {}
        self.points = 0
        """Points priced by the wrapped calibration so far."""
        self.calls = 0
        """Calls into the wrapped calibration."""
        self._objects: dict[int, tuple[Any, Any, object]] = {}
        """id(object argument) -> (the object, kept so that its id stays its own; its key; its
        token in cheap keys)."""
        self._fast: dict[tuple[Any, ...], _Points] = {}
        """Cheap key (operation, fixed scalars, tokens of fixed objects) -> the points of the
        operation with those fixed arguments: most calls find them here, without taking an
        instance's or a kind's content key."""
        self._fixed_at: dict[tuple[str, int], tuple[int, ...]] = {}
        """(operation, arguments given) -> positions of its fixed arguments."""

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.calibration, name)
        if name not in VARYING:
            return method
        varying = VARYING[name]

        def priced(*args: Any, **kwargs: Any) -> Priced | None:
            return self._price(name, method, varying, args, kwargs)

        # kept as an attribute: later look-ups of the operation find it without this method
        # (a composed step calls some 36 operations)
        self.__dict__[name] = priced
        return priced

    def _price(self, name: str, method: Callable[..., Priced | None],
               varying: tuple[int, ...], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Priced | None:
        same = SAME_PRICE.get(name)
        if same is not None:
            args = same(args)
        memo = self._points(name, varying, args, kwargs)
        if memo.none:
            return None
        single = _one_point(args, varying)
        if single is not None:  # most calls: a step's one distinct rank row
            key, shape = single
            i = memo.index.get(key, -1)
            if i < 0:
                keys = self._ahead(name, varying, args, [key], memo)
                rows = np.frombuffer(b"".join(keys), dtype=float).reshape(len(keys),
                                                                         len(varying))
                if not self._fill(memo, method, varying, args, kwargs, keys, rows):
                    return None
                i = memo.index[key]
            if shape == (1,):  # most calls: the point's one answer, made once
                made = memo.one.get(i)
                if made is None:
                    made = memo.one[i] = _frozen(memo.ms[i], memo.code[i], memo.table[i])
                return made
            code = memo.code[i]  # np.array of a list: a third of np.full's time
            return Priced(np.array([memo.ms[i]]).reshape(shape), SOURCES[code], memo.table[i],
                          np.array([code]).reshape(shape))
        if len(varying) == 1:
            one = np.asarray(args[varying[0]], dtype=float)
            shape = one.shape or (1,)
            raw = one.tobytes()
            width = 8
        else:
            try:  # most calls: arrays of one shape, stacked in one call
                x = np.array([args[i] for i in varying], dtype=float)
            except ValueError:  # a number beside arrays, or arrays of other shapes
                x = None
            if x is not None and x.ndim >= 2:
                shape = x.shape[1:]
                raw = x.reshape(len(varying), -1).T.tobytes()  # one row per point
            else:
                values = list(np.broadcast_arrays(
                    *(np.atleast_1d(np.asarray(args[i], dtype=float)) for i in varying)))
                shape = values[0].shape
                raw = np.stack([v.ravel() for v in values], axis=1).tobytes()
            width = 8 * len(varying)
        keys = [raw[i:i + width] for i in range(0, len(raw), width)]
        index = memo.index
        at = [index.get(k, -1) for k in keys]
        if -1 in at:
            new_keys = self._ahead(name, varying, args, list(dict.fromkeys(
                k for k, a in zip(keys, at, strict=True) if a < 0)), memo)
            rows = np.frombuffer(b"".join(new_keys), dtype=float).reshape(-1, width // 8)
            if not self._fill(memo, method, varying, args, kwargs, new_keys, rows):
                return None
            at = [index[k] for k in keys]
        stored, codes, tables = memo.ms, memo.code, memo.table
        if len(at) == 1:
            i = at[0]
            return Priced(np.array([stored[i]]).reshape(shape), SOURCES[codes[i]], tables[i],
                          np.array([codes[i]]).reshape(shape))
        of = itemgetter(*at)  # a tuple of the points' entries, for two or more points
        got = of(codes)
        return Priced(np.array(of(stored)).reshape(shape), SOURCES[max(got)],
                      " + ".join(dict.fromkeys(of(tables))), np.array(got).reshape(shape))

    def _ahead(self, name: str, varying: tuple[int, ...], args: tuple[Any, ...],
               keys: list[bytes], memo: _Points) -> list[bytes]:
        """The new points `keys`, then the decode points priced ahead with them
        (LATTICE_AHEAD): their neighbours on the context lattice not priced yet, after the
        operation's SAME_PRICE (neighbours it prices alike are one point). None are added for
        prefill points or a context off the lattice (the planner's screen, say)."""
        rule = LATTICE_AHEAD.get(name)
        bits = self.lattice_bits
        if rule is None or bits is None or args[rule[0]]:
            return keys
        axis = rule[1]
        rows = []
        for key in keys:
            point = np.frombuffer(key, dtype=float)
            context = float(point[axis])
            if not context >= 1.0 or round_bits(context, bits) != context:
                continue  # off the lattice: more than `bits` significant bits
            around = lattice_around(context, bits, LATTICE_UP, LATTICE_DOWN)
            near = np.repeat(point[None], len(around), axis=0)
            near[:, axis] = around
            rows.append(near)
        if not rows:
            return keys
        near = np.concatenate(rows)  # one row per point, the varying arguments in order
        same = SAME_PRICE.get(name)
        if same is not None:
            call = list(args)
            call[varying[axis]] = near[:, axis]
            near[:, axis] = same(tuple(call))[varying[axis]]
        index = memo.index
        return list(dict.fromkeys([*keys, *(k for k in map(bytes, near) if k not in index)]))

    def _points(self, name: str, varying: tuple[int, ...], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> _Points:
        """The priced points of operation `name` with the fixed arguments of `args`: looked up
        first by a cheap key (scalars by value, objects by a token per object seen), then by
        content (`_fixed`), so that equal objects share their points."""
        fast: tuple[Any, ...] | None = None
        if not kwargs:
            at = self._fixed_at.get((name, len(args)))
            if at is None:
                at = self._fixed_at[name, len(args)] = tuple(
                    i for i in range(len(args)) if i not in varying)
            # a tuple (GEMM shapes) is its own key: a new tuple object per call would take a
            # content key and a token each time, and fill the objects held
            fast = (name, *[a if type(a) in _BY_VALUE else self._token(a)
                            for a in map(args.__getitem__, at)])
            try:
                memo = self._fast.get(fast)
            except TypeError:  # a tuple holding something unhashable: tokens for all
                fast = (name, *[a if type(a) in _SCALARS else self._token(a)
                                for a in map(args.__getitem__, at)])
                memo = self._fast.get(fast)
            if memo is not None:
                return memo
        fixed = tuple(self._key(a) for i, a in enumerate(args) if i not in varying)
        key = (name, fixed, tuple(sorted((k, _fixed(v)) for k, v in kwargs.items())))
        memo = self._memo.get(key)
        if memo is None:
            if self.points > MAX_POINTS or len(self._objects) > MAX_OBJECTS:
                self._memo.clear()
                self._objects.clear()
                self._fast.clear()
                self.points = 0
                if fast is not None:  # its tokens are gone with the objects
                    return self._points(name, varying, args, kwargs)
            memo = self._memo[key] = _Points()
        if fast is not None:
            self._fast[fast] = memo
        return memo

    def _key(self, value: Any) -> Any:
        """`_fixed(value)`, remembered per object for objects (an instance, a kind)."""
        if isinstance(value, int | float | str | bool | None):
            return value
        return self._held(value)[1]

    def _token(self, value: Any) -> Any:
        """A stand-in for `value` in a cheap key: itself for a scalar, else a token of the
        object, equal to nothing but itself (so never to a scalar)."""
        held = self._objects.get(id(value))  # an object held is alive: its id is its own
        if held is not None:
            return held[2]
        if isinstance(value, int | float | str | bool | None):
            return value
        return self._held(value)[2]

    def _held(self, value: Any) -> tuple[Any, Any, object]:
        held = self._objects.get(id(value))
        if held is None:
            held = self._objects[id(value)] = (value, _fixed(value), object())
        return held

    def _fill(self, memo: _Points, method: Callable[..., Priced | None],
              varying: tuple[int, ...], args: tuple[Any, ...], kwargs: dict[str, Any],
              keys: list[bytes], rows: np.ndarray) -> bool:
        """Price the points `rows` (their `keys`) with the wrapped calibration in one call;
        False when the operation has no price (None) for them."""
        call = list(args)
        for j, i in enumerate(varying):
            call[i] = rows[:, j].copy()
        got = method(*call, **kwargs)
        self.calls += 1
        if got is None:
            memo.none = True
            return False
        n = len(keys)
        # each point's own provenance where the pricing gives it: priced among others, a
        # point is no less trustworthy than priced alone
        memo.add(keys, np.broadcast_to(np.asarray(got.ms, dtype=float), (n,)).copy(),
                 np.broadcast_to(got.point_codes().ravel(), (n,)), got.table)
        self.points += n
        return True
