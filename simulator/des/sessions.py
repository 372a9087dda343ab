"""Agentic session trees, as SemiAnalysis AgentX replays them: the in-memory form that the trace
reader (`simulator.des.weka`) and the synthetic generator (`simulator.des.agentx`) produce and
the traffic (`simulator.des.arrivals`) replays.

A trace is one recorded agent run: a root agent's turns and the subagents its turns spawn (each
with turns of its own, and maybe subagents). A turn resends the agent's whole conversation so far,
so its prompt's KV blocks start with the previous turn's. Block ids are scoped to their trace:
a trace's agents may share blocks (a common system prompt), two traces never do.

Block ids are kept as runs, ((first id, count), ...): a turn of a 500K-token prompt in 64-token
blocks holds ~8,000 ids, which as runs of consecutive ids are a handful of pairs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Runs = tuple[tuple[int, int], ...]
"""A prompt's block ids as runs of consecutive ids: ((first id, count), ...)."""


def to_runs(ids: Iterable[int]) -> Runs:
    """Runs of consecutive ids, in order: [5, 6, 7, 2, 3] -> ((5, 3), (2, 2))."""
    out: list[tuple[int, int]] = []
    start = prev = None
    count = 0
    for b in ids:
        b = int(b)
        if prev is not None and b == prev + 1:
            count += 1
        else:
            if start is not None:
                out.append((start, count))
            start, count = b, 1
        prev = b
    if start is not None:
        out.append((start, count))
    return tuple(out)


def run_blocks(runs: Runs) -> int:
    """Blocks in a run list."""
    return sum(n for _, n in runs)


def shift_runs(runs: Runs, offset: int) -> Runs:
    """The same runs with every id moved by `offset` (a replay's own id space)."""
    return tuple((s + offset, n) for s, n in runs)


def expand(runs: Runs) -> list[int]:
    """The ids of a run list, one by one (tests and small traces only)."""
    return [s + i for s, n in runs for i in range(n)]


@dataclass(frozen=True)
class Turn:
    """One request of an agent."""

    t_s: float
    """Recorded start, seconds from the trace's start."""
    input_len: int
    """Prompt tokens (the whole conversation so far plus the new tail)."""
    output_len: int
    """Output tokens, as recorded (replayed with ignore_eos)."""
    blocks: Runs
    """Prompt block ids (block_tokens each, the last block maybe partial), scoped to the trace."""
    think_s: float = 0.0
    """Recorded gap before this turn, end to start: from the completion of the agent's previous
    turn (for an agent's first turn: from its spawn) to this turn's dispatch."""
    api_s: float | None = None
    """Recorded service time of the turn, when the trace has it (used to infer joins)."""


@dataclass(frozen=True)
class Agent:
    """The root agent of a trace, or one subagent."""

    turns: tuple[Turn, ...]
    """At least one."""
    parent: int = -1
    """Index of the parent in SessionTrace.agents; -1 for the root."""
    after_turn: int = -1
    """The parent's turn whose completion spawns this agent (-1: the parent's start)."""
    join_turn: int | None = None
    """The parent's turn that waits until this agent (and its own subagents) finished; None: a
    background agent that gates nothing."""
    kind: str = ""
    """What the trace calls it (subagent_type), for reports only."""


@dataclass(frozen=True)
class SessionTrace:
    """One trace: its agents, root first, every parent before its children."""

    name: str
    block_tokens: int
    agents: tuple[Agent, ...]
    span: int | None = field(default=None, compare=False)
    """One more than the largest block id, where the producer knows it (the generator and the
    reader hand out the ids); None: taken from the turns' runs when first asked."""

    @property
    def requests(self) -> int:
        """Turns of every agent."""
        return sum(len(a.turns) for a in self.agents)

    @property
    def root(self) -> Agent:
        return self.agents[0]

    def children(self, agent: int) -> list[int]:
        """Indexes of the agents `agent` spawns, in order."""
        return [i for i, a in enumerate(self.agents) if a.parent == agent]

    @functools.cached_property
    def id_span(self) -> int:
        """One more than the largest block id (a replay shifts ids by a multiple of this): the
        producer's `span`, else from the runs (every turn resends its history, so a corpus of
        long traces holds millions of runs: seconds to go through)."""
        if self.span is not None:
            return self.span
        return max((s + n for a in self.agents for t in a.turns for s, n in t.blocks),
                   default=0)

    @functools.cached_property
    def spawned(self) -> tuple[dict[int, list[int]], ...]:
        """Per agent: its turn -> the child agents that turn's completion spawns (-1: at the
        agent's start)."""
        out: tuple[dict[int, list[int]], ...] = tuple({} for _ in self.agents)
        for i, a in enumerate(self.agents[1:], 1):
            out[a.parent].setdefault(a.after_turn, []).append(i)
        return out

    @functools.cached_property
    def joined(self) -> tuple[dict[int, list[int]], ...]:
        """Per agent: its turn -> the child agents that turn waits for."""
        out: tuple[dict[int, list[int]], ...] = tuple({} for _ in self.agents)
        for i, a in enumerate(self.agents[1:], 1):
            if a.join_turn is not None:
                out[a.parent].setdefault(a.join_turn, []).append(i)
        return out


def check_tree(agents: Sequence[Agent]) -> str | None:
    """Why `agents` is not a well-formed tree (root first, parents first, turn indexes in range),
    or None."""
    if not agents:
        return "it has no agents"
    if agents[0].parent != -1:
        return "its first agent is not the root"
    for i, a in enumerate(agents):
        if not a.turns:
            return f"agent {i} has no turns"
        if i and not 0 <= a.parent < i:
            return f"agent {i}'s parent {a.parent} does not come before it"
        if i:
            p = agents[a.parent]
            if not -1 <= a.after_turn < len(p.turns):
                return f"agent {i} starts after turn {a.after_turn}, its parent has " \
                       f"{len(p.turns)}"
            if a.join_turn is not None and not a.after_turn < a.join_turn < len(p.turns):
                return f"agent {i} joins turn {a.join_turn}, which is not after its spawn " \
                       f"turn {a.after_turn} in a parent of {len(p.turns)} turns"
    return None
