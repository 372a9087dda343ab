"""Workload spec: how requests arrive, how long they are, and which mode the engine runs in."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from simulator.specs.agentx import AgentxShape, Lognormal
from simulator.specs.errors import SpecError
from simulator.specs.limits import (
    MAX_CONCURRENCY,
    MAX_CONTEXT_TOKENS,
    MAX_REQUESTS,
    MAX_THINK_S,
    MAX_TIME_SCALE,
    MIN_RATE,
)
from simulator.specs.spec import Spec

_SPEC = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# --- arrivals -------------------------------------------------------------------------------


class ClosedArrival(Spec):
    """Closed loop: a fixed number of users, each sends its next request when the last ends."""

    model_config = _SPEC

    kind: Literal["closed"] = "closed"
    """Closed-loop arrival."""
    concurrency: int = Field(ge=1, le=MAX_CONCURRENCY)
    """Requests in flight at all times, at most 1,000,000 (required)."""
    start: Literal["burst", "spread"] = "burst"
    """burst: every user sends its first request at once (a benchmark's first wave). spread:
    the users' first requests are spread evenly over one request's predicted duration, the
    phases a long benchmark's clients end up in once their timings have drifted apart, so that
    requests do not arrive in lock-step waves (default burst)."""


class PoissonArrival(Spec):
    """Open loop: exponential inter-arrival times at a mean rate."""

    model_config = _SPEC

    kind: Literal["poisson"] = "poisson"
    """Poisson arrival."""
    rate: float = Field(ge=MIN_RATE)
    """Mean requests per second, at least 1e-06 (required)."""

    def inter_arrivals(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n gaps between arrivals in seconds."""
        return rng.exponential(1.0 / self.rate, n)


class BurstyArrival(Spec):
    """Open loop: gamma inter-arrival times, shape 1/burstiness, at a mean rate."""

    model_config = _SPEC

    kind: Literal["bursty"] = "bursty"
    """Bursty (gamma) arrival."""
    rate: float = Field(ge=MIN_RATE)
    """Mean requests per second, at least 1e-06 (required)."""
    burstiness: float = Field(4.0, gt=0, le=1_000)
    """Squared coefficient of variation of the gaps: 1 is Poisson, more is burstier, at most
    1,000 (a gamma shape of 0.001: nearly every gap zero) (default 4)."""

    def inter_arrivals(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n gaps between arrivals in seconds, mean 1/rate."""
        shape = 1.0 / self.burstiness
        return rng.gamma(shape, 1.0 / (self.rate * shape), n)


class TraceArrival(Spec):
    """Replay of a recorded trace (arrival times and lengths come from the file)."""

    model_config = _SPEC

    kind: Literal["trace"] = "trace"
    """Trace replay."""
    path: str = Field(min_length=1)
    """Trace file to replay (required); read by the simulator, not by this spec."""
    time_scale: float = Field(1.0, gt=0, le=MAX_TIME_SCALE)
    """Multiplies the trace's timestamps: 0.5 replays twice as fast (default 1.0)."""
    concurrency: int | None = Field(None, ge=1, le=MAX_CONCURRENCY)
    """Replay at a fixed concurrency instead of the timestamps: this many users, each sending
    the trace's next row (in file order) when its last request ends, as AIPerf's
    `--custom-dataset-type mooncake_trace` and `vllm bench serve` replay a trace at
    `--concurrency`; the rows need no timestamps then, at most 1,000,000 (default null: each
    row at its timestamp)."""


class SessionsArrival(Spec):
    """Agentic session trees as SemiAnalysis AgentX replays them: `concurrency` lanes, each
    running one tree (a trace's root agent and its subagents) at a time, the next trace from
    turn 0 when a tree drains; initial lanes start at a sampled point t* after a warmup turn.
    Lengths, block ids, think times and subagents come from the traces; with `traces` unset,
    from a seeded synthetic corpus of AgentX-shaped trees (`shape`, docs/agentx.md)."""

    model_config = _SPEC

    kind: Literal["sessions"] = "sessions"
    """Session-tree replay."""
    concurrency: int = Field(ge=1, le=MAX_CONCURRENCY)
    """Session trees alive at all times, at most 1,000,000 (required); subagents run inside
    their tree's lane."""
    traces: str | None = None
    """AgentX ("weka") traces to replay: a .json/.jsonl file or a folder of them; null: the
    synthetic corpus (default null)."""
    shape: AgentxShape = AgentxShape()
    """Parameters of the synthetic corpus (ignored with `traces`)."""
    start: Literal["t_star", "turn0"] = "t_star"
    """t_star: initial lanes start at a sampled t* of their trace after one warmup turn, as
    the harness does; turn0: every tree from its first turn, no warmup (default t_star)."""
    t_star_min: float = Field(0.0, ge=0, le=1)
    """Earliest t*, as a share of the root's recorded span (default 0.0, the scenario's)."""
    t_star_max: float = Field(1.0, ge=0, le=1)
    """Latest t*, as a share of the root's recorded span (default 1.0, the scenario's)."""
    idle_gap_cap_s: float | None = Field(None, gt=0, le=MAX_THINK_S)
    """Cap on a think time that starts while nothing of its tree is in flight (the harness's
    --trace-idle-gap-cap-seconds); null: think times as recorded (default null)."""
    sampling: Literal["shuffle", "sequential", "random"] = "shuffle"
    """Which trace a lane replays next: a fresh shuffle of the corpus per pass, the corpus in
    order, or a random draw each time (default shuffle)."""

    @model_validator(mode="after")
    def _check(self) -> SessionsArrival:
        if self.t_star_max < self.t_star_min:
            raise SpecError(f"t_star_max={self.t_star_max:g} must be >= "
                            f"t_star_min={self.t_star_min:g}")
        return self


Arrival = Annotated[
    ClosedArrival | PoissonArrival | BurstyArrival | TraceArrival | SessionsArrival,
    Field(discriminator="kind")
]


# --- length distributions -------------------------------------------------------------------


class FixedLength(Spec):
    """Every request has the same length."""

    model_config = _SPEC

    kind: Literal["fixed"] = "fixed"
    """Fixed length."""
    value: int = Field(ge=1, le=MAX_CONTEXT_TOKENS)
    """Tokens per request, at most 10,000,000 (required)."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n lengths (int64)."""
        return np.full(n, self.value, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(self.value)


class UniformLength(Spec):
    """Lengths drawn uniformly from low to high, both included."""

    model_config = _SPEC

    kind: Literal["uniform"] = "uniform"
    """Uniform length."""
    low: int = Field(ge=1, le=MAX_CONTEXT_TOKENS)
    """Shortest length in tokens (required)."""
    high: int = Field(ge=1, le=MAX_CONTEXT_TOKENS)
    """Longest length in tokens, >= low, at most 10,000,000 (required)."""

    @model_validator(mode="after")
    def _check(self) -> UniformLength:
        if self.high < self.low:
            raise SpecError(f"high={self.high} must be >= low={self.low}")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n lengths (int64) in [low, high]."""
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2.0


class LognormalLength(Lognormal):
    """Log-normal lengths, rounded and clipped to [1, max]."""

    kind: Literal["lognormal"] = "lognormal"
    """Log-normal length."""
    median: float = Field(gt=0)
    """Median length in tokens (required)."""
    max: int = Field(131072, ge=1, le=MAX_CONTEXT_TOKENS)
    """Longest length in tokens, at most 10,000,000; longer draws are clipped to it (default
    131072)."""

    @property
    def mean(self) -> float:
        """Mean of the clipped distribution (rounding ignored)."""
        mu, s, m = math.log(self.median), self.sigma, float(self.max)
        if s == 0:
            return min(self.median, m)
        z = (math.log(m) - mu) / s
        below = math.exp(mu + s * s / 2) * _phi(z - s)
        return max(1.0, below + m * (1.0 - _phi(z)))


def _phi(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


Length = Annotated[FixedLength | UniformLength | LognormalLength, Field(discriminator="kind")]


# --- workload -------------------------------------------------------------------------------


class Sessions(Spec):
    """Agentic multi-turn traffic: each turn's input holds the whole previous context."""

    model_config = _SPEC

    turns: int = Field(ge=1, le=MAX_REQUESTS)
    """Requests per session (required); a turn's input is the previous turns plus new input."""
    think_time_s: float = Field(0.0, ge=0, le=MAX_THINK_S)
    """Seconds between a turn's last token and the next turn's arrival, at most a day (default
    0)."""


class Workload(Spec):
    """The traffic a deployment serves in one simulation or benchmark."""

    model_config = _SPEC

    arrival: Arrival = ClosedArrival(concurrency=2048)
    """How requests arrive: closed, poisson, bursty, trace or sessions (default closed,
    concurrency 2048)."""
    requests: int = Field(4000, ge=1, le=MAX_REQUESTS)
    """Requests to send in all, each session turn counting as one; with a sessions arrival the
    measured ones (warmup turns come on top); at most 10,000,000 (default 4000)."""
    input_tokens: Length = FixedLength(value=2000)
    """Input (prompt) length: fixed, uniform or lognormal (default fixed 2000)."""
    output_tokens: Length = FixedLength(value=1000)
    """Output length: fixed, uniform or lognormal (default fixed 1000)."""
    prefix_hit_rate: float = Field(0.0, ge=0, lt=1)
    """Share of input tokens served from the prefix cache, in [0, 1) (default 0)."""
    sessions: Sessions | None = None
    """Multi-turn sessions {turns, think_time_s}; null sends independent requests (default)."""
    mode: Literal["serve", "prefill_only", "decode_only"] = "serve"
    """serve end to end, or bench one role alone: prefill_only or decode_only (default serve)."""
    context_tokens: int = Field(2000, ge=1, le=MAX_CONTEXT_TOKENS)
    """decode_only: KV-cache length per request in tokens (default 2000)."""
    seed: int = Field(0, ge=0)
    """Seed of every random draw of the run (default 0)."""

    @model_validator(mode="after")
    def _check(self) -> Workload:
        if self.sessions is not None and self.mode != "serve":
            raise SpecError(f"sessions need mode 'serve', not mode={self.mode!r}")
        if isinstance(self.arrival, SessionsArrival):
            if self.sessions is not None:
                raise SpecError("a sessions arrival replays session trees with their own "
                                "turns and think times; drop `sessions` (it is for the "
                                "closed, poisson and bursty arrivals)")
            if self.mode == "decode_only":
                raise SpecError("a sessions arrival replays whole turns; mode decode_only "
                                "holds a fixed context instead (give mode serve or "
                                "prefill_only)")
        return self
