"""Expert load of an expert-parallel instance: skewed per-layer popularity, EPLB placement of
redundant replicas, and the token-to-expert assignments each EP rank receives in a step.

Popularity: for each MoE layer, each expert's weight is drawn from a power law (a Pareto
distribution with exponent `alpha`, truncated at `max_ratio` times its minimum) from a seeded
generator, then normalized; or it is read from recorded per-expert token counts. With
alpha 1.1 and max_ratio 32 the hottest expert of a 256-expert layer gets about 4x the mean, which
leaves DEP32 ranks about 1.8x apart (max/mean) without EPLB. EPLB is fitted to the true
popularity (an ideal, static EPLB), so with redundant experts the expected imbalance is near 0;
multinomial sampling adds the per-step noise that no placement removes.

Redundant replicas are placed by `simulator.eplb.rebalance` on that popularity (identity
placement when there are none); an expert's tokens are split evenly over its replicas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from simulator.eplb import Placement, identity_placement, imbalance, rebalance
from simulator.specs.errors import SpecError

Sampling = Literal["expected", "multinomial"]
"""expected: each step's assignments follow the popularity exactly (fast, memoizes well);
multinomial: each step's assignments are drawn, so small batches are noisier."""


def power_law_popularity(rng: np.random.Generator, layers: int, experts: int,
                         alpha: float = 1.1, max_ratio: float = 32.0) -> np.ndarray:
    """(layers, experts) routing probabilities; each row sums to 1."""
    if alpha <= 0 or max_ratio < 1:
        raise SpecError(f"alpha={alpha} must be > 0 and max_ratio={max_ratio} >= 1")
    u = rng.random((layers, experts))
    if abs(alpha - 1.0) < 1e-9:
        x = max_ratio ** u  # the alpha -> 1 limit of the truncated Pareto's inverse CDF
    else:
        a1 = 1.0 - alpha
        x = ((max_ratio ** a1 - 1.0) * u + 1.0) ** (1.0 / a1)
    p: np.ndarray = x / x.sum(axis=1, keepdims=True)
    return p


def read_expert_counts(source: str | Path | np.ndarray, layers: int, experts: int) -> np.ndarray:
    """(layers, experts) routing probabilities from recorded token counts per expert.

    `source`: an array, or a .npy / .csv file, of shape (layers, experts) or (experts,) (the
    same counts for every layer).
    """
    if isinstance(source, np.ndarray):
        counts = source.astype(float)
    else:
        p = Path(source)
        if not p.is_file():
            raise SpecError(f"expert count file {str(p)!r} does not exist; give a .npy or .csv")
        try:
            counts = (np.load(p) if p.suffix.lower() == ".npy"
                      else np.loadtxt(p, delimiter=",", ndmin=2)).astype(float)
        except ValueError as e:
            raise SpecError(f"{p}: not a numeric table of expert counts ({e})") from None
    counts = np.atleast_2d(counts)
    if counts.shape[1] != experts or counts.shape[0] not in (1, layers):
        raise SpecError(f"expert counts have shape {counts.shape}; the model needs "
                        f"({layers}, {experts}) or (1, {experts})")
    if not np.isfinite(counts).all() or (counts < 0).any() or (counts.sum(axis=1) <= 0).any():
        raise SpecError("expert counts must be finite, non-negative, and not all zero in a layer")
    counts = np.broadcast_to(counts, (layers, experts))
    p_: np.ndarray = counts / counts.sum(axis=1, keepdims=True)
    return p_


class ExpertLoad:
    """Where one instance's experts sit, and how a step's tokens load its EP ranks."""

    def __init__(self, popularity: np.ndarray, ranks: int, redundant: int, top_k: int,
                 sampling: Sampling = "expected", rng: np.random.Generator | None = None) -> None:
        layers, experts = popularity.shape
        self.popularity = popularity
        self.ranks, self.top_k, self.sampling = ranks, top_k, sampling
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.placement: Placement = (
            rebalance(popularity, experts + redundant, 1, 1, ranks) if redundant > 0
            else identity_placement(layers, experts))
        share = self.placement.rank_load(popularity, ranks)  # (layers, ranks), rows sum to 1
        self.expected_imbalance = imbalance(share)
        """(max - mean) / mean of tokens per EP rank, averaged over layers, in expectation."""
        self.profile = np.sort(share, axis=1)[:, ::-1].mean(axis=0)
        """Shares of the step's assignments per EP rank, most-loaded first, layer-averaged."""

    def step(self, tokens: float) -> tuple[np.ndarray, float]:
        """Assignments per EP rank (most-loaded first) for a step of `tokens` tokens over the
        instance, and that step's imbalance."""
        assignments = tokens * self.top_k
        if self.sampling == "expected" or assignments <= 0:
            return assignments * self.profile, self.expected_imbalance
        counts = self.rng.multinomial(round(assignments), self.popularity)
        load = self.placement.rank_load(counts, self.ranks)
        return np.sort(load, axis=1)[:, ::-1].mean(axis=0), imbalance(load)
