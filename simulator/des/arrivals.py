"""Traffic: when requests arrive, how long they are, and multi-turn sessions.

- poisson / bursty: open loop, gaps from the arrival spec;
- closed: `concurrency` users, each sending its next request (or session) when the last ends;
- trace: rows of a trace file at their timestamps (times `time_scale`), or, with a
  `concurrency`, in file order by that many closed-loop users; lengths and prefix block ids
  from the file;
- sessions: AgentX's lanes of session trees (`simulator.des.replay`).

With sessions, a unit of traffic is a session of `turns` requests: each turn's prompt is the
whole previous context (prompts and outputs so far) plus new input, and the prompt's 512-token
blocks get ids that persist from turn to turn, so prefix-cache hits come from the traffic
itself. Open-loop sessions start at rate / turns, so requests still arrive at about `rate`.

Lengths are drawn up front, one per request id, from their own seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from simulator.des.prefix_cache import BLOCK_TOKENS
from simulator.des.replay import TreeReplay
from simulator.des.requests import RequestTable
from simulator.des.sessions import Runs, SessionTrace, to_runs
from simulator.des.traces import Trace
from simulator.specs.errors import SpecError
from simulator.specs.workload import ClosedArrival, SessionsArrival, TraceArrival, Workload


class Traffic:
    """Makes the run's requests and hands each to `submit` when it arrives."""

    def __init__(self, env: simpy.Environment, workload: Workload, table: RequestTable,
                 submit: Callable[[int], None], rng: np.random.Generator,
                 trace: Trace | None = None, spread_s: float = 0.0,
                 corpus: list[SessionTrace] | None = None) -> None:
        self.env, self.workload, self.table, self.submit = env, workload, table, submit
        self.rng, self.trace = rng, trace
        self.replay: TreeReplay | None = None
        """The lanes of a sessions arrival."""
        self._measured = 0
        if isinstance(workload.arrival, SessionsArrival):
            if not corpus:
                raise SpecError("a sessions arrival needs at least one session trace")
            self.replay = TreeReplay(env, workload.arrival, corpus, rng, self._send,
                                     lambda: self.remaining)
        self.spread_s = spread_s
        """Closed loop: the users' first requests are spread evenly over this many seconds."""
        n, w = table.capacity, workload
        if trace is None:
            self.new_input = w.input_tokens.sample(rng, n)
            self.output = w.output_tokens.sample(rng, n)
            if w.mode == "decode_only":
                self.new_input = np.full(n, w.context_tokens, dtype=np.int64)
        else:
            self.new_input, self.output = trace.input_len[:n], trace.output_len[:n]
        if w.mode == "prefill_only":
            self.output = np.ones(n, dtype=np.int64)  # the one token a prefill samples
        self._waiters: dict[int, simpy.Event] = {}
        self._next_block = 0
        self._sessions = 0

    @property
    def remaining(self) -> int:
        """Measured requests still to send (warmup turns do not count)."""
        return self.workload.requests - self._measured if self.replay is not None else (
            self.table.capacity - self.table.count)

    @property
    def window(self) -> tuple[float, float | None]:
        """The window throughput is counted over: with session lanes, from the end of the
        warmup turns to the last measured dispatch, every lane busy all along as in the
        harness's fixed-duration run (the tokens of the turns completed in it, over it); else
        (0, None): from the start to the last completion."""
        if self.replay is None:
            return 0.0, None
        return self.replay.window_start, self.replay.window_end

    def start(self) -> None:
        a = self.workload.arrival
        if isinstance(a, TraceArrival) and self.trace is None:
            raise SpecError("trace arrival needs a trace")
        if self.replay is not None:
            self.replay.start()
        elif isinstance(a, TraceArrival) and a.concurrency is None:
            assert self.trace is not None  # checked above
            self.env.process(self._replay(self.trace))
        elif isinstance(a, ClosedArrival | TraceArrival):  # users; a trace's rows in file order
            assert a.concurrency is not None
            users = min(a.concurrency, self.table.capacity)
            for i in range(users):
                self.env.process(self._user(self.spread_s * i / users))
        else:
            assert not isinstance(a, SessionsArrival)
            units = self.table.capacity
            if self.workload.sessions is not None:
                units = -(-units // self.workload.sessions.turns)
            self.env.process(self._open(a.inter_arrivals(self.rng, units)))

    def done(self, rid: int) -> None:
        """Request `rid` finished (wakes its closed-loop user or session)."""
        ev = self._waiters.pop(rid, None)
        if ev is not None:
            ev.succeed()

    # ---- processes -----------------------------------------------------------------------

    def _replay(self, trace: Trace) -> Generator[Any, Any, None]:
        for i in range(self.table.capacity):
            gap = float(trace.arrival_s[i]) - self.env.now
            if gap > 0:  # rows with one timestamp arrive together
                yield self.env.timeout(gap)
            ids = trace.blocks[i]
            self._send(int(trace.input_len[i]), int(trace.output_len[i]),
                       None if ids is None else to_runs(ids))

    def _open(self, gaps: np.ndarray) -> Generator[Any, Any, None]:
        for gap in gaps:
            yield self.env.timeout(float(gap))
            if not self.remaining:
                return
            if self.workload.sessions is not None:
                self.env.process(self._session())
            else:
                rid = self.table.count
                self._send(int(self.new_input[rid]), int(self.output[rid]), None)

    def _user(self, delay: float = 0.0) -> Generator[Any, Any, None]:
        if delay > 0:
            yield self.env.timeout(delay)
        while self.remaining:
            if self.workload.sessions is not None:
                yield from self._session()
            else:
                rid = self.table.count
                ids = None if self.trace is None else self.trace.blocks[rid]
                yield self._send(int(self.new_input[rid]), int(self.output[rid]),
                                 None if ids is None else to_runs(ids), wait=True)

    def _session(self) -> Generator[Any, Any, None]:
        assert self.workload.sessions is not None
        turns, think = self.workload.sessions.turns, self.workload.sessions.think_time_s
        context, ids = 0, list[int]()  # context tokens so far; ids of its full blocks
        session = self._sessions
        self._sessions += 1
        for turn in range(turns):
            if not self.remaining:
                return
            rid = self.table.count
            prompt = context + int(self.new_input[rid])
            while len(ids) < prompt // BLOCK_TOKENS:
                ids.append(self._next_block)
                self._next_block += 1
            output = int(self.output[rid])
            yield self._send(prompt, output, to_runs(ids[: prompt // BLOCK_TOKENS]), wait=True,
                             session=session, depth=turn)
            context = prompt + output
            del ids[prompt // BLOCK_TOKENS:]  # the output changes the last, partial block
            if think > 0 and turn < turns - 1:
                yield self.env.timeout(think)

    def _send(self, prompt: int, output: int, blocks: Runs | None, wait: bool = False,
              session: int = -1, tree: int = -1, depth: int = 0,
              warmup: bool = False) -> simpy.Event:
        t = self.table
        if self.workload.mode == "prefill_only":
            output = 1  # a turn of a prefill-only replay samples its one token
        rid = t.new(self.env.now, prompt, output, blocks)
        t.session[rid], t.tree[rid], t.depth[rid], t.warmup[rid] = session, tree, depth, warmup
        if not warmup:
            self._measured += 1
            if self.replay is not None and self.remaining == 0:
                self.replay.window_end = self.env.now
        ev = self.env.event()
        if wait:
            self._waiters[rid] = ev
        self.submit(rid)
        return ev
