"""Interpolation over measured kernel latencies, normalised by a roofline.

A table is a set of measured points over numeric axes (for example GEMM m, n, k). Rather than
interpolating latency directly, we interpolate the *efficiency* (roofline time / measured time)
multilinearly in log-axis space, then divide the query's own roofline time by it. That keeps
power laws straight, transfers the nearest measured efficiency to shapes outside the measured range,
and gives back a measured point exactly.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass
from itertools import product

import numpy as np

MEASURED, INTERPOLATED, EXTRAPOLATED, ROOFLINE = 0, 1, 2, 3
SOURCES = ("measured", "interpolated", "extrapolated", "roofline")
"""Provenance of a price, best first; an array of codes indexes this tuple."""

NEAREST_CHUNK = 1 << 20
"""Query x measured-cell distances computed at once by the nearest-cell search (8 MB per
axis); a table holds a few thousand measured cells, so a step's queries take one pass."""

NEAREST_DIRECT = 2
"""Up to this many queries `Grid.nearest` takes the direct form alone (its two passes cost
more numpy calls than they save)."""


def worst(codes: np.ndarray | int) -> str:
    """The least trustworthy provenance among several prices."""
    return SOURCES[int(np.max(codes))]


@dataclass(frozen=True)
class Grid:
    """Measured latencies on a (possibly sparse) regular grid over numeric axes."""

    axes: tuple[np.ndarray, ...]
    """Sorted distinct values per axis."""
    latency: np.ndarray
    """Measured ms per grid cell; NaN where nothing was measured."""
    log_eff: np.ndarray
    """log(roofline ms / measured ms) per cell; NaN where nothing was measured."""
    cells: tuple[np.ndarray, ...]
    """Grid indices of the measured cells (one array per axis, aligned)."""

    @functools.cached_property
    def _cell_logs(self) -> np.ndarray:
        """The measured cells in log-axis space (cells x axes)."""
        return np.stack([np.log(self.axes[j][c]) for j, c in enumerate(self.cells)], axis=1)

    @functools.cached_property
    def _cell_axes(self) -> tuple[np.ndarray, ...]:
        """The measured cells' log coordinates, one contiguous array per axis."""
        return tuple(np.ascontiguousarray(self._cell_logs[:, j])
                     for j in range(self._cell_logs.shape[1]))

    @functools.cached_property
    def _cell_norms(self) -> np.ndarray:
        """|cell|^2 of each measured cell in log-axis space."""
        norms: np.ndarray = (self._cell_logs ** 2).sum(axis=1)
        return norms

    def nearest(self, log_points: np.ndarray) -> np.ndarray:
        """Per query (rows of log-axis coordinates): the index, into `cells`, of the measured
        cell nearest to it in log-axis space (Euclidean; on a tie the first). A direct search
        (a table holds a few thousand measured cells, and a tree would cost more to import and
        build than the queries that fall back to it) in two passes: squared distances as
        |q|^2 - 2 q.c + |c|^2 (one matrix product) pick the candidates within a margin far
        above that form's rounding error of the smallest, and the candidates' distances taken
        directly, sum((q - c)^2), decide, so that the answer is that of the direct form over
        every cell, bit for bit (`nearest_direct`)."""
        q = np.atleast_2d(np.asarray(log_points, dtype=float))
        if len(q) <= NEAREST_DIRECT:  # the direct form, one axis at a time (the same sums)
            out = np.empty(len(q), dtype=np.intp)
            first, *rest = self._cell_axes
            for i, (x0, *xs) in enumerate(q.tolist()):
                d2 = (first - x0) ** 2
                for x, axis in zip(xs, rest, strict=True):
                    d2 = d2 + (axis - x) ** 2
                out[i] = int(np.argmin(d2))
            return out
        coords = self._cell_logs
        out = np.empty(len(q), dtype=np.intp)
        rows = max(NEAREST_CHUNK // max(len(coords), 1), 1)
        qn_all = (q ** 2).sum(axis=1)
        margin = 1e-9 * (qn_all + float(self._cell_norms.max(initial=0.0)) + 1.0)
        for s in range(0, len(q), rows):
            part = q[s:s + rows]
            approx = qn_all[s:s + rows, None] - 2.0 * (part @ coords.T) + self._cell_norms
            near = approx <= approx.min(axis=1, keepdims=True) + margin[s:s + rows, None]
            qi, ci = np.nonzero(near)  # row-major: by query, then by cell index
            d2 = ((part[qi] - coords[ci]) ** 2).sum(axis=1)
            starts = np.flatnonzero(np.concatenate(([True], qi[1:] != qi[:-1])))
            best = np.repeat(np.minimum.reduceat(d2, starts), np.diff(np.append(starts,
                                                                              len(qi))))
            at = np.flatnonzero(d2 == best)
            _, first = np.unique(qi[at], return_index=True)  # the first cell of each query
            out[s:s + rows] = ci[at[first]]
        return out

    def nearest_direct(self, log_points: np.ndarray) -> np.ndarray:
        """`nearest` by the direct form alone, sum((q - c)^2) over every cell (the reference
        `nearest` must agree with)."""
        coords = self._cell_logs
        q = np.atleast_2d(np.asarray(log_points, dtype=float))
        rows = max(NEAREST_CHUNK // max(len(coords), 1), 1)
        out = np.empty(len(q), dtype=np.intp)
        for s in range(0, len(q), rows):
            d2 = ((q[s:s + rows, None, :] - coords[None, :, :]) ** 2).sum(axis=2)
            out[s:s + rows] = np.argmin(d2, axis=1)
        return out

    @functools.cached_property
    def _log_axes(self) -> tuple[np.ndarray, ...]:
        return tuple(np.log(ax) for ax in self.axes)

    @functools.cached_property
    def _log_axes_lists(self) -> tuple[list[float], ...]:
        return tuple(la.tolist() for la in self._log_axes)

    @functools.cached_property
    def _corner_tuples(self) -> list[tuple[int, ...]]:
        return list(product((0, 1), repeat=len(self.axes)))

    @functools.cached_property
    def _flat(self) -> tuple[list[float], list[float], tuple[int, ...]]:
        """log_eff and latency as flat lists of plain floats, and the index strides (a single
        point's query reads a few cells, and numpy's scalar indexing dominates at that size)."""
        strides = tuple(int(np.prod(self.log_eff.shape[j + 1:], dtype=np.int64))
                        for j in range(self.log_eff.ndim))
        return self.log_eff.ravel().tolist(), self.latency.ravel().tolist(), strides

    def _query_one(self, point: np.ndarray, roofline: float,
                   exact: bool) -> tuple[np.ndarray, np.ndarray]:
        """`query` for a single point, in plain floats (a step prices one point per
        operation, and numpy's per-call cost dominates at that size); the same arithmetic.

        An axis where the point sits on a grid value (or the axis has one value) weighs its
        other corners 0 and this one 1, so it only picks the cell: only the other axes'
        corners are visited, with the same products and sums as visiting all of them."""
        flat_eff, flat_lat, strides = self._flat
        base = 0  # flat offset of the axes the point sits on
        pairs: list[tuple[tuple[int, float], tuple[int, float]]] = []
        snapped: list[int] = []  # per axis: the offset of the nearer cell, for a measured point
        outside, on_node = False, True
        for x, la, st in zip(np.log(point).tolist(), self._log_axes_lists, strides,
                             strict=True):
            if len(la) == 1:
                outside = outside or abs(x - la[0]) > 1e-9
                snapped.append(0)
                continue
            h = min(max(bisect.bisect_left(la, x), 1), len(la) - 1)
            tj = (x - la[h - 1]) / (la[h] - la[h - 1])
            outside = outside or tj < -1e-9 or tj > 1 + 1e-9
            tj = min(max(tj, 0.0), 1.0)
            on_node = on_node and (tj < 1e-12 or tj > 1 - 1e-12)
            snapped.append((h if tj > 0.5 else h - 1) * st)
            if tj == 0.0:
                base += (h - 1) * st
            elif tj == 1.0:
                base += h * st
            else:
                pairs.append((((h - 1) * st, 1.0 - tj), (h * st, tj)))
        acc = wsum = 0.0
        for corner in product(*pairs):
            w = 1.0
            at = base
            for off, f in corner:
                w *= f
                at += off
            if w <= 0:
                continue
            v = flat_eff[at]
            if v == v:  # not NaN
                acc += w * v
                wsum += w
        code = EXTRAPOLATED if outside else INTERPOLATED
        if wsum > 1e-12:
            log_eff = acc / wsum
        else:  # no measured corner: nearest measured cell in log space
            nearest = int(self.nearest(np.log(point))[0])
            log_eff = float(self.log_eff[tuple(c[nearest] for c in self.cells)])
            code = EXTRAPOLATED
        ms = roofline / math.exp(log_eff)
        if exact and not outside and on_node:
            lat = flat_lat[sum(snapped)]
            if lat == lat:
                ms, code = lat, MEASURED
        return np.array([ms]), np.array([code])

    @functools.cached_property
    def _corners(self) -> np.ndarray:
        """The 2^d corners of a cell as 0/1 rows (bool), axis order."""
        return np.array(list(product((0, 1), repeat=len(self.axes))), dtype=bool).reshape(
            -1, len(self.axes))

    @classmethod
    def build(cls, points: np.ndarray, latency: np.ndarray, roofline: np.ndarray) -> Grid:
        """From measured points (N x d), their latency and their roofline time (both in ms).

        Where a cell was measured more than once (several kernels), the fastest counts: the engine
        picks its best kernel.
        """
        points = np.asarray(points, dtype=float)
        axes = tuple(np.unique(points[:, j]) for j in range(points.shape[1]))
        idx = tuple(np.searchsorted(ax, points[:, j]) for j, ax in enumerate(axes))
        lat = np.full(tuple(len(a) for a in axes), np.inf)
        np.minimum.at(lat, idx, latency)
        eff = np.full(lat.shape, np.inf)
        np.minimum.at(eff, idx, latency / roofline)  # ms per roofline ms, fastest kernel wins
        lat[np.isinf(lat)] = np.nan
        log_eff = -np.log(np.where(np.isinf(eff), np.nan, eff))
        cells = np.nonzero(~np.isnan(lat))
        return cls(axes, lat, log_eff, cells)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The grid as named arrays (for the disk cache); `from_arrays` gives it back."""
        out = {"latency": self.latency, "log_eff": self.log_eff}
        for j, (ax, c) in enumerate(zip(self.axes, self.cells, strict=True)):
            out[f"axis{j}"], out[f"cells{j}"] = ax, c
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Grid:
        """The grid `to_arrays` wrote, bit for bit."""
        d = arrays["latency"].ndim
        return cls(tuple(arrays[f"axis{j}"] for j in range(d)), arrays["latency"],
                   arrays["log_eff"], tuple(arrays[f"cells{j}"] for j in range(d)))

    def query(self, points: np.ndarray, roofline: np.ndarray,
              exact: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Latency (ms) and provenance code for each query point (Q x d).

        `exact`: a query on a measured point gets its measured latency; turn it off when the
        grid stands in for another shape or dtype (the query's own roofline must then scale
        even the measured points)."""
        points = np.atleast_2d(np.asarray(points, dtype=float))
        roofline = np.broadcast_to(np.asarray(roofline, dtype=float), (points.shape[0],))
        q, d = points.shape
        if q == 1 or ((points == points[0]).all() and (roofline == roofline[0]).all()):
            ms1, code1 = self._query_one(points[0], float(roofline[0]), exact)
            return (ms1, code1) if q == 1 else (np.repeat(ms1, q), np.repeat(code1, q))
        lo = np.empty((q, d), dtype=np.intp)
        hi = np.empty((q, d), dtype=np.intp)
        t = np.empty((q, d))
        outside = np.zeros(q, dtype=bool)
        logs = np.log(points)
        for j, la in enumerate(self._log_axes):
            x = logs[:, j]
            if len(la) == 1:
                lo[:, j] = hi[:, j] = 0
                t[:, j] = 0.0
                outside |= np.abs(x - la[0]) > 1e-9
                continue
            h = np.clip(np.searchsorted(la, x), 1, len(la) - 1)
            lo[:, j], hi[:, j] = h - 1, h
            tj = (x - la[h - 1]) / (la[h] - la[h - 1])
            outside |= (tj < -1e-9) | (tj > 1 + 1e-9)
            t[:, j] = np.clip(tj, 0.0, 1.0)
        # every corner of every query's cell at once: (corners, q, d)
        corners = self._corners[:, None, :]
        idx = np.where(corners, hi[None], lo[None])
        w = np.where(corners, t[None], 1.0 - t[None]).prod(axis=2)
        v = self.log_eff[tuple(idx[..., j] for j in range(d))]
        ok = ~np.isnan(v) & (w > 0)
        acc = np.where(ok, w * np.where(ok, v, 0.0), 0.0).sum(axis=0)
        wsum = np.where(ok, w, 0.0).sum(axis=0)
        code = np.where(outside, EXTRAPOLATED, INTERPOLATED)
        log_eff = np.empty(q)
        have = wsum > 1e-12
        log_eff[have] = acc[have] / wsum[have]
        if (~have).any():  # no measured corner: nearest measured cell in log space
            nearest = self.nearest(np.log(points[~have]))
            cell = tuple(c[nearest] for c in self.cells)
            log_eff[~have] = self.log_eff[cell]
            code[~have] = EXTRAPOLATED
        # math.exp, as `_query_one` takes it: a point's price is the same whichever points it
        # is queried with (numpy's exp may differ from it in the last bit on some CPUs)
        ms = roofline / np.array([math.exp(v) for v in log_eff.tolist()])
        # A measured point comes back exactly, not through the efficiency round trip.
        on_node = (~outside) & np.all((t < 1e-12) | (t > 1 - 1e-12), axis=1)
        if exact and on_node.any():
            node = tuple(np.where(t[on_node, j] > 0.5, hi[on_node, j], lo[on_node, j])
                         for j in range(d))
            lat = self.latency[node]
            got = ~np.isnan(lat)
            sel = np.flatnonzero(on_node)[got]
            ms[sel] = lat[got]
            code[sel] = MEASURED
        return ms, code
