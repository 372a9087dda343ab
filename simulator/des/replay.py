"""Session trees replayed the way SemiAnalysis AgentX replays them (`arrival: {kind: sessions}`).

- `concurrency` lanes, each running one session tree (a replay of one trace: its root agent and
  every subagent) at a time; a lane whose whole tree drained draws the next trace and replays it
  from turn 0. Subagents run inside their lane: the requests in flight may exceed the lanes.
- The initial lanes start at a point t* drawn uniformly in [t_star_min, t_star_max] of their
  root's recorded span. The root turn just before t* is sent first as a warmup turn (it carries
  the whole context so far and primes the cache); subagents spawned before it are taken as done.
  Once every warmup turn has finished, t* lands for every lane at once (the measured window
  starts) and each root continues at its first turn after t*, as far after the boundary as that
  turn was after t*. Warmup turns are left out of every metric.
- A turn is sent its recorded think time after the agent's previous turn ended (end to start);
  with `idle_gap_cap_s`, a wait that starts while nothing of the tree is in flight is capped at
  that. A subagent starts its first turn's think time after the parent turn that spawns it ends;
  a parent turn that joins subagents waits until they (and theirs) have all finished.
- Block ids are shifted into one id space per tree, so a tree's agents share blocks and two
  replays of one trace never do (the harness's per-session cache-bust marker).
- `requests` bounds the measured turns sent; then no lane sends another.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from simulator.des.agentx import generate
from simulator.des.sessions import SessionTrace, shift_runs
from simulator.des.traces import file_stamp
from simulator.des.weka import read_weka
from simulator.specs.agentx import AgentxShape
from simulator.specs.workload import SessionsArrival


def load_corpus(arrival: SessionsArrival, seed: int) -> list[SessionTrace]:
    """The traces a sessions arrival replays: its trace files, else the synthetic corpus of
    its shape. Either is made once per process (a search screens and simulates one workload
    many times): files for as long as their path, size and modification time stay the same."""
    if arrival.traces is not None:
        path = Path(arrival.traces)
        return _read(path, tuple(file_stamp(f) for f in _trace_files(path)))
    return _generated(arrival.shape, seed)


def corpus_lengths(arrival: SessionsArrival, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output tokens of every turn of every agent of the corpus `arrival` replays."""
    turns = [t for trace in load_corpus(arrival, seed) for a in trace.agents for t in a.turns]
    return (np.array([t.input_len for t in turns], dtype=np.int64),
            np.array([t.output_len for t in turns], dtype=np.int64))


def _trace_files(path: Path) -> list[Path]:
    return sorted(path.iterdir()) if path.is_dir() else [path]


@functools.lru_cache(maxsize=4)
def _read(path: Path, stamps: tuple[tuple[str, int, int], ...]) -> list[SessionTrace]:
    return read_weka(path)


@functools.lru_cache(maxsize=4)
def _generated(shape: AgentxShape, seed: int) -> list[SessionTrace]:
    return generate(shape, seed)


@dataclass
class _Tree:
    """One live session tree."""

    trace: SessionTrace
    number: int
    """Replay number in the run (its id space and its tree id)."""
    offset: int
    """Added to every block id of the trace."""
    done: dict[int, simpy.Event] = field(default_factory=dict)
    """Agent -> fires when the agent and all it spawned finished (started agents only)."""
    inflight: int = 0
    """Requests of the tree in flight."""


Send = Callable[..., simpy.Event]


class TreeReplay:
    """The lanes of a sessions arrival."""

    def __init__(self, env: simpy.Environment, arrival: SessionsArrival,
                 corpus: list[SessionTrace], rng: np.random.Generator, send: Send,
                 budget: Callable[[], int]) -> None:
        self.env, self.arrival, self.corpus, self.rng = env, arrival, corpus, rng
        self.send, self.budget = send, budget
        self._span = max(t.id_span for t in corpus) + 1
        self._order: list[int] = []
        self._trees = 0
        self._conversations = 0
        self._warm_left = 0
        self.boundary = env.event()
        """Fires when every warmup turn has finished: the start of the measured window."""
        self.window_start = 0.0
        self.window_end: float | None = None
        """When the last measured turn was sent (None while the budget lasts)."""

    def start(self) -> None:
        a = self.arrival
        starts = []
        for _ in range(a.concurrency):
            i = self._draw()
            k, lead = self._t_star_turn(self.corpus[i]) if a.start == "t_star" else (0, 0.0)
            starts.append((i, k, lead))
        self._warm_left = sum(1 for _, k, _ in starts if k > 0)
        if not self._warm_left:
            self._open()
        for i, k, lead in starts:
            self.env.process(self._lane(i, k, lead))

    # ---- lanes ---------------------------------------------------------------------------

    def _draw(self) -> int:
        """The next trace a lane replays (shuffle, sequential or random)."""
        mode, n = self.arrival.sampling, len(self.corpus)
        if mode == "random":
            return int(self.rng.integers(n))
        if not self._order:
            self._order = list(self.rng.permutation(n)) if mode == "shuffle" else list(range(n))
            self._order.reverse()
        return int(self._order.pop())

    def _t_star_turn(self, trace: SessionTrace) -> tuple[int, float]:
        """(first measured root turn k*, seconds from t* to that turn) for a drawn t*."""
        a, turns = self.arrival, trace.root.turns
        t_star = float(self.rng.uniform(a.t_star_min, a.t_star_max)) * turns[-1].t_s
        k = next((i for i, t in enumerate(turns) if t.t_s >= t_star), len(turns) - 1)
        return k, max(turns[k].t_s - t_star, 0.0)

    def _lane(self, first: int, k_star: int, lead: float) -> Generator[Any, Any, None]:
        i = first
        while self.budget() > 0:
            tree = self._new_tree(i)
            yield from self._run_tree(tree, k_star, lead)
            i, k_star, lead = self._draw(), 0, 0.0

    def _new_tree(self, i: int) -> _Tree:
        number = self._trees
        self._trees += 1
        return _Tree(self.corpus[i], number, number * self._span)

    def _open(self) -> None:
        self.window_start = self.env.now
        self.boundary.succeed()

    def _run_tree(self, tree: _Tree, k_star: int, lead: float) -> Generator[Any, Any, None]:
        conv = self._conversation()
        if k_star > 0:  # warm the cache with the turn before t*, then wait for the boundary
            yield self._request(tree, 0, k_star - 1, conv, warmup=True)
            self._warm_left -= 1
            if not self._warm_left:
                self._open()
        if not self.boundary.triggered:
            yield self.boundary
        yield self.env.process(self._agent(tree, 0, k_star, lead if k_star else None, conv))

    # ---- agents --------------------------------------------------------------------------

    def _conversation(self) -> int:
        self._conversations += 1
        return self._conversations - 1

    def _agent(self, tree: _Tree, a: int, first: int,
               lead: float | None = None, conv: int | None = None) -> Generator[Any, Any, None]:
        """Agent `a` of `tree` from its turn `first`: its turns, the subagents they spawn, and
        then the wait for everything it spawned. `lead`: the wait before turn `first` instead
        of its think time."""
        turns = tree.trace.agents[a].turns
        spawned, joined = tree.trace.spawned[a], tree.trace.joined[a]
        conv = self._conversation() if conv is None else conv
        # what the turn before `first` spawned starts now (the earlier ones count as done)
        children = self._spawn(tree, spawned.get(first - 1, []))
        for k in range(first, len(turns)):
            gates = [tree.done[c] for c in joined.get(k, []) if c in tree.done]
            if gates:
                yield self.env.all_of(gates)
            wait = turns[k].think_s if (lead is None or k != first) else lead
            wait = self._capped(tree, wait)
            if wait > 0:
                yield self.env.timeout(wait)
            if self.budget() <= 0:
                break
            tree.inflight += 1
            yield self._request(tree, a, k, conv)
            tree.inflight -= 1
            children += self._spawn(tree, spawned.get(k, []))
        if children:
            yield self.env.all_of(children)

    def _spawn(self, tree: _Tree, agents: list[int]) -> list[simpy.Event]:
        out: list[simpy.Event] = []
        for c in agents:
            proc = self.env.process(self._agent(tree, c, 0))
            tree.done[c] = proc
            out.append(proc)
        return out

    def _capped(self, tree: _Tree, wait: float) -> float:
        cap = self.arrival.idle_gap_cap_s
        if cap is not None and tree.inflight == 0:
            return min(wait, cap)
        return wait

    def _request(self, tree: _Tree, a: int, k: int, conv: int,
                 warmup: bool = False) -> simpy.Event:
        t = tree.trace.agents[a].turns[k]
        return self.send(t.input_len, t.output_len, shift_runs(t.blocks, tree.offset),
                         session=conv, tree=tree.number, depth=k, warmup=warmup, wait=True)
