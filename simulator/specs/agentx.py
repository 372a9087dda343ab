"""The shape of a synthetic AgentX-like corpus: what `simulator.des.agentx.generate` draws.

The SemiAnalysis AgentX benchmark replays recorded agentic-coding traces (the public `062126`
corpus: ~393 traces, ~99k requests, ~57k of them top-level turns). Those traces are not always at
hand, so this spec describes a corpus of the same shape with simple parametric forms, and its
defaults reproduce the corpus aggregates the benchmark's FAQ publishes: ~145 root turns and ~107
subagent requests per trace, about half of the root turns above 256K tokens of input + output,
inputs capped at 990K, and the sizes of the FAQ's example trace (a 4,160-token system prompt,
512-token tails, outputs of 312-822 tokens). Where the FAQ says nothing (think times, fan-out,
join share) the default is a judgement, and its docstring says so.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from simulator.specs.errors import SpecError
from simulator.specs.limits import MAX_CONTEXT_TOKENS, MAX_THINK_S
from simulator.specs.spec import Spec

_SPEC = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Lognormal(Spec):
    """Log-normal whole numbers (token counts, turn counts), rounded and clipped to [1, max]."""

    model_config = _SPEC

    median: float = Field(gt=0)
    """Median value (required)."""
    sigma: float = Field(1.0, ge=0)
    """Standard deviation of the log of the value (default 1.0)."""
    max: int = Field(ge=1, le=MAX_CONTEXT_TOKENS)
    """Largest value, at most 10,000,000; larger draws are clipped to it (required)."""

    @model_validator(mode="after")
    def _check(self) -> Lognormal:
        if self.median > self.max:
            raise SpecError(f"median={self.median:g} must be <= max={self.max}")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n values (int64) in [1, max]."""
        x = np.rint(rng.lognormal(math.log(self.median), self.sigma, n))
        return np.clip(x, 1, self.max).astype(np.int64)


class LognormalSeconds(Spec):
    """Log-normal durations in seconds, clipped to [0, max]."""

    model_config = _SPEC

    median: float = Field(gt=0)
    """Median duration in seconds (required)."""
    sigma: float = Field(1.0, ge=0)
    """Standard deviation of the log of the duration (default 1.0)."""
    max: float = Field(600.0, gt=0, le=MAX_THINK_S)
    """Longest duration in seconds, at most a day; longer draws are clipped to it (default
    600)."""

    @model_validator(mode="after")
    def _check(self) -> LognormalSeconds:
        if self.median > self.max:
            raise SpecError(f"median={self.median:g} s must be <= max={self.max:g} s")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n durations (float64) in (0, max]."""
        return np.minimum(rng.lognormal(math.log(self.median), self.sigma, n), self.max)


class AgentxShape(Spec):
    """Parameters of a synthetic corpus of AgentX-shaped session trees."""

    model_config = _SPEC

    traces: int = Field(393, ge=1, le=10_000)
    """Traces in the corpus. Default 393: the FAQ's size of the public `062126` corpus."""
    root_turns: Lognormal = Lognormal(median=90, sigma=1.0, max=4000)
    """Turns of a trace's root agent. Default lognormal, median 90, sigma 1.0 (max 4,000): mean
    ~147, the FAQ's ~57k top-level turns over ~393 traces (~145); the spread is a judgement."""
    system_tokens: int = Field(4160, ge=1, le=MAX_CONTEXT_TOKENS)
    """System prompt plus tool definitions, shared by every agent of a trace. Default 4,160: the
    FAQ example's system_tokens 2,304 + tool_tokens 1,856, 65 whole 64-token blocks."""
    first_message: Lognormal = Lognormal(median=4032, sigma=1.0, max=200_000)
    """The root's first user message. Default lognormal, median 4,032: the FAQ example's first
    prompt of 8,192 tokens less its system prompt; sigma 1.0 is a judgement."""
    tail_tokens: Lognormal = Lognormal(median=512, sigma=1.85, max=100_000)
    """New tokens a root turn appends after the previous output (tool results; heavy-tailed).
    Default lognormal, median 512 (the FAQ example's turn grows by 512 tokens), sigma 1.85 and
    max 100,000 chosen so that about half of the root turns pass 256K tokens, as the FAQ reports."""
    output_tokens: Lognormal = Lognormal(median=450, sigma=0.8, max=32_000)
    """Output tokens of a root turn. Default lognormal, median 450, sigma 0.8: the FAQ example's
    outputs run 312-822 tokens; the spread is a judgement."""
    think_s: LognormalSeconds = LognormalSeconds(median=2.0, sigma=1.2, max=600.0)
    """Client gap before a turn, end to start (tool execution, the user). Default lognormal,
    median 2 s, sigma 1.2, max 600 s: a judgement around the FAQ example's 5.6 s."""
    spawn_probability: float = Field(0.0375, ge=0, le=1)
    """Chance that a root turn (not the last) spawns subagents when it ends. Default 0.0375, chosen
    with fanout_mean and subagent_turns to give the FAQ's ~107 subagent requests per trace."""
    fanout_mean: float = Field(1.8, ge=1)
    """Mean subagents spawned together by one turn (1 + Poisson), overlapping in time. Default
    1.8: a judgement (the FAQ says subagents fan out, not how widely)."""
    fanout_max: int = Field(8, ge=1, le=1_000)
    """Most subagents one turn spawns. Default 8: a judgement."""
    join_share: float = Field(0.8, ge=0, le=1)
    """Share of subagents whose parent's next turn waits for them (a join); the rest run in the
    background. Default 0.8: a judgement (the FAQ says both kinds occur, not in what share)."""
    subagent_turns: Lognormal = Lognormal(median=6, sigma=1.1, max=400)
    """Turns of one subagent. Default lognormal, median 6, sigma 1.1 (mean ~11), chosen with
    spawn_probability and fanout_mean to give the FAQ's ~107 subagent requests per trace."""
    subagent_task: Lognormal = Lognormal(median=960, sigma=1.0, max=100_000)
    """A subagent's first message (its task), after the shared system prompt. Default lognormal,
    median 960: the FAQ example's subagent prompt of 5,120 tokens less the system prompt."""
    subagent_tail: Lognormal = Lognormal(median=512, sigma=1.85, max=100_000)
    """New tokens a subagent turn appends (tool results). Default: the root's tail_tokens."""
    subagent_output: Lognormal = Lognormal(median=600, sigma=0.8, max=32_000)
    """Output tokens of a subagent turn. Default lognormal, median 600, sigma 0.8: the FAQ
    example's subagent output is 822 tokens; the spread is a judgement."""
    compact_summary: Lognormal = Lognormal(median=16_000, sigma=0.5, max=64_000)
    """Summary an agent restarts from, after the system prompt, when its context would pass
    max_input (compaction). Default lognormal, median 16,000: a judgement."""
    max_input: int = Field(990_000, ge=2, le=MAX_CONTEXT_TOKENS)
    """Longest prompt in tokens. Default 990,000: the FAQ's per-request input cap of the full
    corpus."""
    block_size: int = Field(64, ge=1, le=MAX_CONTEXT_TOKENS)
    """Tokens per KV block id. Default 64: the block_size of the harness's traces."""
    latency_s: float = Field(0.5, ge=0, le=MAX_THINK_S)
    """Nominal fixed part of a request's recorded service time (api_time). Default 0.5 s: with
    prefill_tps and decode_tps it puts the FAQ example's turns (4.1, 6.3, 9.8 s) within ~10%."""
    prefill_tps: float = Field(10_000.0, gt=0)
    """Nominal prefill speed of the uncached prompt tokens, tokens/s, for api_time. Default
    10,000: see latency_s."""
    decode_tps: float = Field(100.0, gt=0)
    """Nominal decode speed, tokens/s, for api_time. Default 100: see latency_s."""

    @model_validator(mode="after")
    def _check(self) -> AgentxShape:
        if self.system_tokens >= self.max_input:
            raise SpecError(f"system_tokens={self.system_tokens} must be below "
                            f"max_input={self.max_input}")
        if self.fanout_mean > self.fanout_max:
            raise SpecError(f"fanout_mean={self.fanout_mean:g} must be <= "
                            f"fanout_max={self.fanout_max}")
        return self


SAMPLE = AgentxShape(
    traces=8,
    root_turns=Lognormal(median=10, sigma=0.5, max=24),
    first_message=Lognormal(median=1500, sigma=0.5, max=6000),
    tail_tokens=Lognormal(median=300, sigma=1.0, max=3000),
    output_tokens=Lognormal(median=250, sigma=0.6, max=2000),
    spawn_probability=0.15,
    subagent_turns=Lognormal(median=3, sigma=0.5, max=8),
    subagent_task=Lognormal(median=600, sigma=0.5, max=3000),
    subagent_tail=Lognormal(median=300, sigma=1.0, max=3000),
    subagent_output=Lognormal(median=300, sigma=0.6, max=2000),
    compact_summary=Lognormal(median=2000, sigma=0.3, max=4000),
    max_input=32_000,
)
"""The shape of examples/traces/agentx-sample.jsonl (seed 0): 8 small traces (prompts up to 32K
tokens, a few dozen requests a trace), a file of ~100 KB."""

