"""A synthetic corpus of AgentX-shaped session trees, and the aggregates that describe a corpus.

`generate` draws traces of the shape an `AgentxShape` describes. Per trace:

- The root agent's first prompt is the system prompt (plus tools) and a first user message; each
  later turn resends the previous prompt and output plus a new tail (tool results). Its block ids
  therefore extend the previous turn's: the previous prompt's whole blocks keep their ids, and
  from the previous prompt's partial last block on, the ids are new (a block id names a block
  and everything before it, and that block now holds more tokens).
- When a prompt would pass `max_input`, the agent compacts: the turn starts again from the system
  prompt plus a summary (`compact_summary`) and its tail, so its ids past the system prompt are
  new.
- A root turn other than the last spawns subagents with `spawn_probability`, 1 + Poisson of them
  (`fanout_mean`, at most `fanout_max`). A subagent starts fresh (system prompt plus its task;
  the system prompt's blocks are the root's), grows the same way, and starts its first turn when
  the spawning turn ends. With `join_share` it joins: the parent's next turn waits for it;
  otherwise it runs in the background. Subagents spawn no subagents of their own.
- Times are whole milliseconds. A turn's recorded service time (api_s) is nominal:
  latency_s + uncached prompt tokens / prefill_tps + output tokens / decode_tps, where the
  uncached tokens are those past the blocks the agent's previous turn (or, for a first turn or a
  compaction, the system prompt) already holds. A turn starts think_s after the later of its
  agent's previous turn's end and the end of the subagents it waits for; its recorded think_s is
  that whole gap, as a recording would show it, and is at least 1 ms, so a joined subagent's end
  always comes strictly before the turn it gates (the weka reader infers the same join).

Every draw comes from one numpy generator seeded with `seed`, trace after trace, so a run is
deterministic and the first k traces of a larger corpus are the corpus of k traces.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from simulator.des.sessions import Agent, Runs, SessionTrace, Turn
from simulator.specs.agentx import AgentxShape
from simulator.specs.errors import SpecError

CONTEXT_256K = 256_000
"""The context window the `_256k` corpora are cut at: requests whose input + output pass it are
dropped there; corpus_stats reports the share of such requests."""


def generate(shape: AgentxShape, seed: int, traces: int | None = None) -> list[SessionTrace]:
    """`traces` (default shape.traces) synthetic session trees drawn with numpy seed `seed`."""
    count = shape.traces if traces is None else traces
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SpecError(f"traces={count!r} must be an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError(f"seed={seed!r} must be an integer >= 0")
    rng = np.random.default_rng(seed)
    with no_gc():
        return [_trace(shape, rng, f"agentx-{seed}-{i:05d}") for i in range(count)]


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: a corpus is millions of small acyclic tuples, which
    it would otherwise scan again and again as they pile up (more than half the run time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _trace(shape: AgentxShape, rng: np.random.Generator, name: str) -> SessionTrace:
    """One trace: the root's turns, then its subagents in spawn order."""
    ids = [shape.system_tokens // shape.block_size]  # next free id; the first are the system's
    n = int(shape.root_turns.sample(rng, 1)[0])
    first = shape.system_tokens + int(shape.first_message.sample(rng, 1)[0])
    tails = shape.tail_tokens.sample(rng, n)
    outs = shape.output_tokens.sample(rng, n)
    think_ms = _millis(shape.think_s.sample(rng, n))
    think_ms[0] = 0
    inputs, blocks, uncached = _conversation(shape, rng, ids, first, tails, outs, False)
    api_ms = _api_ms(shape, uncached, outs)

    spawns = _spawns(shape, rng, n)
    subs = _subagents(shape, rng, ids, len(spawns))
    by_turn: dict[int, list[int]] = {}
    for k, i in enumerate(spawns.tolist()):
        by_turn.setdefault(i, []).append(k)
    api, think = api_ms.tolist(), think_ms.tolist()
    gates = [0] * (n + 1)
    t = [0] * n
    agents: list[Agent] = []
    end = 0
    for i in range(n):
        if i:
            t[i] = max(end, gates[i]) + think[i]
            think[i] = t[i] - end
        end = t[i] + api[i]
        for k in by_turn.get(i, ()):
            agent, finish = subs[k].schedule(end, i)
            agents.append(agent)
            if agent.join_turn is not None:
                gates[i + 1] = max(gates[i + 1], finish)
    root = Agent(turns=_turns(t, inputs, outs.tolist(), blocks, think, api))
    return SessionTrace(name=name, block_tokens=shape.block_size, agents=(root, *agents),
                        span=ids[0])


def _spawns(shape: AgentxShape, rng: np.random.Generator, n: int) -> np.ndarray:
    """The spawning root turn of each subagent, in order (never the last turn: a joining
    subagent needs a next turn to gate)."""
    spawning = np.flatnonzero(rng.random(n) < shape.spawn_probability)
    spawning = spawning[spawning < n - 1]
    fan = 1 + rng.poisson(shape.fanout_mean - 1.0, len(spawning))
    return np.repeat(spawning, np.minimum(fan, shape.fanout_max))


class _Subagent:
    """One subagent's draws and blocks, waiting for its spawn time."""

    def __init__(self, inputs: list[int], outs: np.ndarray, blocks: list[Runs],
                 think_ms: np.ndarray, api_ms: np.ndarray, joins: bool) -> None:
        self.inputs, self.outs, self.blocks = inputs, outs, blocks
        self.think_ms, self.api_ms, self.joins = think_ms, api_ms, joins

    def schedule(self, spawn_ms: int, after_turn: int) -> tuple[Agent, int]:
        """The agent spawned at `spawn_ms` by parent turn `after_turn`, and its end in ms."""
        steps = self.api_ms[:-1] + self.think_ms[1:]
        t_ms = spawn_ms + np.concatenate(([0], np.cumsum(steps)))
        turns = _turns(t_ms.tolist(), self.inputs, self.outs.tolist(), self.blocks,
                       self.think_ms.tolist(), self.api_ms.tolist())
        join = after_turn + 1 if self.joins else None
        agent = Agent(turns=turns, parent=0, after_turn=after_turn, join_turn=join,
                      kind="synthetic")
        return agent, int(t_ms[-1] + self.api_ms[-1])


def _subagents(shape: AgentxShape, rng: np.random.Generator, ids: list[int],
               count: int) -> list[_Subagent]:
    """`count` subagents, their per-turn draws made at once and split."""
    if not count:
        return []
    lengths = shape.subagent_turns.sample(rng, count)
    tasks = shape.subagent_task.sample(rng, count)
    joins = rng.random(count) < shape.join_share
    total = int(lengths.sum())
    tails = shape.subagent_tail.sample(rng, total)
    outs = shape.subagent_output.sample(rng, total)
    thinks = _millis(shape.think_s.sample(rng, total))
    cuts = np.cumsum(lengths)[:-1]
    out: list[_Subagent] = []
    for k, (tail, o, th) in enumerate(zip(np.split(tails, cuts), np.split(outs, cuts),
                                          np.split(thinks, cuts), strict=True)):
        th[0] = 0
        first = shape.system_tokens + int(tasks[k])
        inputs, blocks, uncached = _conversation(shape, rng, ids, first, tail, o, True)
        out.append(_Subagent(inputs, o, blocks, th, _api_ms(shape, uncached, o), bool(joins[k])))
    return out


def _conversation(shape: AgentxShape, rng: np.random.Generator, ids: list[int], first: int,
                  tails: np.ndarray, outs: np.ndarray,
                  subagent: bool) -> tuple[list[int], list[Runs], np.ndarray]:
    """Prompt lengths, block runs and uncached prompt tokens of one agent's turns; new block ids
    come from ids[0] on (and move it)."""
    bs, cap, system = shape.block_size, shape.max_input, shape.system_tokens
    n_sys = system // bs
    tail_list, out_list = tails.tolist(), outs.tolist()
    n = len(out_list)
    inputs, uncached = [0] * n, [0] * n
    blocks: list[Runs] = [()] * n
    runs: list[tuple[int, int]] = []
    next_id, size = ids[0], 0
    for i in range(n):
        prev = size
        size = first if i == 0 else prev + out_list[i - 1] + tail_list[i]
        if i == 0 or size > cap:
            if i:
                size = system + int(shape.compact_summary.sample(rng, 1)[0]) + tail_list[i]
            size = min(size, cap)
            runs = [(0, n_sys)] if n_sys else []
            kept = n_sys
            cached = n_sys * bs if subagent or i else 0
        else:
            kept = prev // bs
            if prev % bs:  # the previous prompt's partial last block: a new id from here on
                start, length = runs[-1]
                runs[-1:] = [(start, length - 1)] if length > 1 else []
            cached = kept * bs
        add = -(-size // bs) - kept
        if add > 0:
            if runs and runs[-1][0] + runs[-1][1] == next_id:
                runs[-1] = (runs[-1][0], runs[-1][1] + add)
            else:
                runs.append((next_id, add))
            next_id += add
        inputs[i], blocks[i], uncached[i] = size, tuple(runs), size - cached
    ids[0] = next_id
    return inputs, blocks, np.array(uncached, dtype=np.int64)


def _millis(seconds: np.ndarray) -> np.ndarray:
    """Durations in whole milliseconds, at least 1."""
    return np.maximum(1, np.rint(seconds * 1000.0)).astype(np.int64)


def _api_ms(shape: AgentxShape, uncached: np.ndarray, outs: np.ndarray) -> np.ndarray:
    """Nominal service time of each turn in ms (see the module docstring)."""
    s = shape.latency_s + uncached / shape.prefill_tps + outs / shape.decode_tps
    return _millis(s)


def _turns(t_ms: Sequence[int], inputs: Sequence[int], outs: Sequence[int],
           blocks: Sequence[Runs], think_ms: Sequence[int],
           api_ms: Sequence[int]) -> tuple[Turn, ...]:
    """Turns from per-turn columns (times in ms)."""
    return tuple(
        Turn(t_s=t / 1000.0, input_len=i, output_len=o, blocks=b, think_s=th / 1000.0,
             api_s=a / 1000.0)
        for t, i, o, b, th, a in zip(t_ms, inputs, outs, blocks, think_ms, api_ms, strict=True))


def corpus_stats(traces: Sequence[SessionTrace]) -> dict[str, float]:
    """Aggregates of a corpus, the ones the AgentX FAQ quotes and a few more: traces, requests,
    root turns, subagents and subagent requests per trace; the shares of root turns, of subagent
    requests and of all requests whose input + output pass 256K tokens; mean and max input, mean
    output and think time; the share of subagents that join."""
    if not traces:
        raise SpecError("corpus_stats needs at least one trace, not an empty list")
    root_len: list[int] = []
    root_out: list[int] = []
    sub_len: list[int] = []
    sub_out: list[int] = []
    think: list[float] = []
    subagents = joined = 0
    for trace in traces:
        for k, agent in enumerate(trace.agents):
            lens, outs = (root_len, root_out) if k == 0 else (sub_len, sub_out)
            lens.extend(t.input_len for t in agent.turns)
            outs.extend(t.output_len for t in agent.turns)
            think.extend(t.think_s for t in agent.turns)
            if k:
                subagents += 1
                joined += agent.join_turn is not None
    r_in, r_out = np.array(root_len, dtype=np.int64), np.array(root_out, dtype=np.int64)
    s_in, s_out = np.array(sub_len, dtype=np.int64), np.array(sub_out, dtype=np.int64)
    all_in, all_out = np.concatenate((r_in, s_in)), np.concatenate((r_out, s_out))
    n = len(traces)
    return {
        "traces": float(n),
        "requests": float(len(all_in)),
        "root_turns_per_trace": len(r_in) / n,
        "subagents_per_trace": subagents / n,
        "subagent_requests_per_trace": len(s_in) / n,
        "root_share_over_256k": float(np.mean(r_in + r_out > CONTEXT_256K)),
        "subagent_share_over_256k": float(np.mean(s_in + s_out > CONTEXT_256K))
        if len(s_in) else 0.0,
        "request_share_over_256k": float(np.mean(all_in + all_out > CONTEXT_256K)),
        "mean_input": float(all_in.mean()),
        "max_input": float(all_in.max()),
        "mean_output": float(all_out.mean()),
        "mean_think_s": float(np.mean(think)),
        "join_share": joined / subagents if subagents else 0.0,
    }
