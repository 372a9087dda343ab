"""Dynamo's DeepSeek-V4.1-Flash recipes beside rackplan's predictions: vLLM on B200, GB200 and
H200, aggregated and prefill/decode, replaying an agentic Mooncake trace at a fixed concurrency.

The published figures (ai-dynamo/dynamo, Apache-2.0: `recipes/deepseek-v4.1-flash/README.md`,
"Performance results", and the rendered recipe guide's "Measured Performance"; two sets measured
at different operating points, with their recipes) are transcribed in TARGETS with each
deployment as the recipe describes it. The benchmark replays with AIPerf
(`--custom-dataset-type mooncake_trace`, the rows in order at `CONCURRENCY`, ignore_eos): rackplan
replays the same way (`arrival: {kind: trace, concurrency: N}`).

The trace (`64k_400_90kv_agent_new_noschedule_short_15perc.jsonl`, 3,541 rows) is a Git LFS
file that cannot be fetched here. Without `--trace`, a seeded stand-in with the statistics the
recipes publish is written and replayed (`stand_in`): 3,541 rows, input median ~67,600 tokens,
p99 above 450,000 and longest above 900,000, output median ~400, about 90 % of input tokens a
repeat of an earlier row's prefix. How the real trace arranges its sessions (turns per session,
how far apart a session's turns sit in the file) is not published: the stand-in's choices are
in `StandIn`, and the figures move with them. Give `--trace` the real file to replay it.

Every figure is the recipe's SLO-clearing operating point; the recipes say throughput repeats to
about 3 % across identical runs.

Run: .venv/bin/python benchmarks/dynamo_v41.py [--only NAME ...] [--trace FILE] [--json]
     [--workers 2]   (all ten targets: a few minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.des.prefix_cache import BLOCK_TOKENS  # noqa: E402
from simulator.specs.deployment import Deployment, Precision, RoleSpec, Speculative  # noqa: E402
from simulator.specs.workload import TraceArrival, Workload  # noqa: E402

README = "recipes/deepseek-v4.1-flash/README.md (Performance results)"
GUIDE = "the recipe guide (Measured Performance)"
TRACE_ROWS = 3541

DRAFT = Speculative(method="dspark", tokens=3, acceptance=0.78)
"""DSpark with 3 draft tokens (every vLLM target); the acceptance per draft token is not
published: InferenceX's reference for V4.1-Flash's DSpark (3.51 accepted of a 5-token block)."""


@dataclass(frozen=True)
class Target:
    """One published operating point and the deployment its recipe runs."""

    name: str
    source: str
    hardware: str
    concurrency: int
    published: dict[str, float]
    """tok_s_gpu (output tokens/s per GPU), user_p50 (output tok/s per user), ttft_p50 /
    ttft_p90 / itl_p50 (ms), whichever the source gives. AIPerf's ITL is a request's time
    after its first token over its other tokens, rackplan's TPOT (`tpot_ms`), not the gap
    between streamed chunks (`itl_ms`, a DSpark step's several tokens at once)."""
    aggregated: int = 0
    """Aggregated TP4 instances (0: a P/D target)."""
    prefill: int = 0
    decode: int = 0
    prefill_tokens: int = 8192
    """The prefill (or aggregated) role's max_num_batched_tokens."""
    long_prefill: int = 0
    """The prefill role's --long-prefill-token-threshold (0: unset)."""
    kv_cache: str = "fp8"
    indexer: str = "fp4"
    memory: float = 0.9
    extra: dict[str, Any] = field(default_factory=dict)


def _pub(tok_s_gpu: float, user_p50: float, ttft_p50: float, **more: float) -> dict[str, float]:
    return {"tok_s_gpu": tok_s_gpu, "user_p50": user_p50, "ttft_p50": ttft_p50, **more}


TARGETS = (
    # README: TP4 + EP, MegaMoE, fp8_ds_mla KV, MXFP4 indexer keys, DSpark 3, engine defaults
    # for max-num-seqs and memory; P/D: 2 prefill + 1 decode, 32,768 prefill tokens a step of
    # which one prompt takes at most 4,096 (--long-prefill-token-threshold)
    Target("readme-b200-agg", README, "b200", 88, _pub(488.9, 54.65, 210, itl_p50=18.30),
           aggregated=2),
    Target("readme-b200-pd", README, "b200", 160, _pub(610.8, 52.14, 2389, itl_p50=19.18),
           prefill=2, decode=1, prefill_tokens=32768, long_prefill=4096),
    Target("readme-gb200-agg", README, "gb200", 88, _pub(533.2, 54.23, 296, itl_p50=18.44),
           aggregated=2),
    Target("readme-gb200-pd", README, "gb200", 168, _pub(694.7, 59.86, 3237, itl_p50=16.71),
           prefill=2, decode=1, prefill_tokens=32768, long_prefill=4096),
    # the guide: aggregated at 16,384 tokens a step and 0.92 of memory; P/D 1 + 1 (B200 with
    # the fp4 KV records its auto dtype resolved to); H200: CUTLASS MoE, 8,192 tokens
    Target("guide-b200-agg", GUIDE, "b200", 168, _pub(990.57, 54.69, 178.66, ttft_p90=3068.28),
           aggregated=2, prefill_tokens=16384, memory=0.92),
    Target("guide-b200-pd", GUIDE, "b200", 184,
           _pub(1087.71, 82.12, 135.12, ttft_p90=90076.83), prefill=1, decode=1,
           prefill_tokens=32768, long_prefill=4096, kv_cache="fp4"),
    Target("guide-gb200-agg", GUIDE, "gb200", 168, _pub(953.08, 51.83, 286.75, ttft_p90=3524.82),
           aggregated=2, prefill_tokens=16384, memory=0.92),
    Target("guide-gb200-pd", GUIDE, "gb200", 168,
           _pub(1154.87, 80.85, 169.02, ttft_p90=57116.54), prefill=1, decode=1,
           prefill_tokens=32768, long_prefill=4096, memory=0.92),
    Target("guide-h200-agg", GUIDE, "h200", 80, _pub(209.18, 51.32, 171.29, ttft_p90=6368.76),
           aggregated=4, memory=0.92),
    Target("guide-h200-pd", GUIDE, "h200", 64, _pub(359.41, 50.63, 177.59, ttft_p90=35043.23),
           prefill=1, decode=1, memory=0.92),
)


KV_ROUTER = {"router": "kv_router"}
"""The recipes' frontend routes with Dynamo's KV router (`DYN_ROUTER_MODE=kv`). An aggregated
worker's cost is its prefill and decode-footprint terms at their default weights
(`kv_router`); for P/D, Dynamo's prefill router turns active-block tracking off, which leaves
the prefill terms: `prefix_aware`, the prefill role's default. The agentic aggregated recipes
also charge 50 blocks per active request (`DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT`), which is
not modelled (6,400 tokens a request, beside contexts of ~68,000 and more)."""


def deployment(t: Target) -> Deployment:
    """The recipe's deployment: TP4 instances with expert parallelism and DSpark 3."""
    def role(instances: int, tokens: int, long_prefill: int = 0) -> RoleSpec:
        return RoleSpec(instances=instances, tp=4, enable_expert_parallel=True,
                        max_num_seqs=1024, max_num_batched_tokens=tokens, speculative=DRAFT,
                        gpu_memory_utilization=t.memory,
                        long_prefill_token_threshold=long_prefill)

    roles: dict[str, RoleSpec] = (
        {"aggregated": role(t.aggregated, t.prefill_tokens).model_copy(update=KV_ROUTER)}
        if t.aggregated else
        {"prefill": role(t.prefill, t.prefill_tokens, t.long_prefill),
         "decode": role(t.decode, 8192)})
    return Deployment(model="deepseek-v4.1-flash", hardware=t.hardware, engine="vllm",
                      precision=Precision(weights="fp4", kv_cache=t.kv_cache,
                                          indexer_cache=t.indexer), **roles)


@dataclass(frozen=True)
class StandIn:
    """How the stand-in trace is drawn (seeded). Published: rows, the input median (~67,600),
    p99 (> 450,000) and longest (> 900,000), the output median (~400), ~90 % designed KV reuse,
    Mooncake 512-token blocks. Chosen so that the drawn rows meet those (`benchmarks/
    dynamo_v41.py --stats`): everything else."""

    rows: int = TRACE_ROWS
    first_median: float = 44_000.0
    """A session's first prompt (lognormal, `first_sigma`): the task, its files and the
    agent's scaffold."""
    first_sigma: float = 1.05
    growth_median: float = 2_500.0
    """What a turn adds besides the last output: tool results (lognormal, sigma 1)."""
    turns_median: float = 14.0
    """Turns of a session (lognormal, sigma 0.6, at least 2)."""
    output_median: float = 400.0
    """Output lengths: lognormal, sigma 0.5, 16-4,096 tokens."""
    system_prompts: int = 4
    system_tokens: int = 16_384
    """Sessions start with one of a few shared system prompts (an agent scaffold's: its
    instructions and tool definitions)."""
    lanes: int = 256
    """Sessions in flight in the recording, each lane starting a new session when its last
    ends; the file takes turns round by round, so a session's turns sit about this many rows
    apart (lanes x (1 +- 0.2)). A recorded trace sends a session's next turn after its last
    one answered, so the rows between them are at least the requests the recording system had
    in flight; this many exceeds every published replay concurrency (64-184), so a turn's
    prefix has been computed when it is sent, as the published TTFTs (p50 0.14-0.3 s for
    prompts of ~67,600 tokens) imply. Not published: the figures move with it."""
    longest: int = 990_000


def stand_in(path: Path, shape: StandIn = StandIn(), seed: int = 0) -> None:
    """Write a Mooncake-format trace of `shape` (input_length, output_length, hash_ids) to
    `path`: sessions whose turns resend the whole growing history."""
    rng = np.random.default_rng(seed)
    block = BLOCK_TOKENS
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    systems = [fresh(shape.system_tokens // block) for _ in range(shape.system_prompts)]
    sessions: list[tuple[list[int], list[int], np.ndarray]] = []

    def session() -> int:
        turns = max(2, round(rng.lognormal(math.log(shape.turns_median), 0.6)))
        first = rng.lognormal(math.log(shape.first_median), shape.first_sigma)
        outs = np.clip(np.round(rng.lognormal(math.log(shape.output_median), 0.5, turns)),
                       16, 4096).astype(int)
        grow = rng.lognormal(math.log(shape.growth_median), 1.0, turns)
        prompts = [min(int(first), shape.longest)]
        for k in range(turns - 1):
            prompts.append(min(int(prompts[-1] + outs[k] + grow[k]), shape.longest))
        sessions.append((systems[int(rng.integers(len(systems)))], prompts, outs))
        return len(sessions) - 1

    # each lane's sessions back to back, a turn a round (jittered): the file is the turns in
    # time order, cut at `rows`
    rounds = -(-shape.rows // shape.lanes) + 1
    events = []
    for _ in range(shape.lanes):
        t = 0
        while t < rounds:
            i = session()
            for k in range(len(sessions[i][1])):
                events.append((t + float(rng.uniform(-0.1, 0.1)), i, k))
                t += 1
    events.sort()
    held: dict[int, list[int]] = {}
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for _, i, k in events[:shape.rows]:
            system, prompts, outs = sessions[i]
            prompt, out = prompts[k], int(outs[k])
            ids = held.get(i, system)[: -(-prompt // block)]
            ids = ids + fresh(-(-prompt // block) - len(ids))
            grown = ids[: prompt // block]  # the next turn holds this prompt and its output
            held[i] = grown + fresh(max((prompt + out) // block - len(grown), 0))
            f.write(json.dumps({"input_length": prompt, "output_length": out,
                                "hash_ids": ids}) + "\n")
    tmp.replace(path)


def trace_stats(path: Path) -> dict[str, float]:
    """What the recipes publish of their trace, measured on `path`; the reuse share counts a
    row's leading blocks seen in any earlier row."""
    seen: set[int] = set()
    inputs, outputs, reused = [], [], 0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        n, ids = int(row["input_length"]), row.get("hash_ids") or []
        hit = next((j for j, b in enumerate(ids) if b not in seen), len(ids))
        reused += min(hit * BLOCK_TOKENS, n)
        seen.update(ids)
        inputs.append(n)
        outputs.append(int(row["output_length"]))
    a = np.array(inputs)
    return {"rows": len(a), "input_median": float(np.median(a)),
            "input_p99": float(np.percentile(a, 99)), "input_max": float(a.max()),
            "output_median": float(np.median(outputs)), "reuse": reused / float(a.sum())}


def predict(job: tuple[Target, str]) -> dict[str, Any]:
    """The target's metrics as `rackplan simulate` computes them (serving latencies in)."""
    from planner.evaluate import sim_options
    from simulator.des import simulate

    t, trace = job
    d = deployment(t)
    wl = Workload(arrival=TraceArrival(path=trace, concurrency=t.concurrency),
                  requests=TRACE_ROWS)
    m = simulate(d, wl, options=sim_options(d)).metrics()
    return {"tok_s_gpu": m["output_tok_s_gpu"], "user_p50": m["tok_s_user"]["p50"],
            "ttft_p50": m["ttft_ms"]["p50"], "ttft_p90": m["ttft_ms"]["p90"],
            "itl_p50": m["tpot_ms"]["p50"], "cache_hit_share": m["cache_hit_share"],
            "gpus": m["gpus"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help=f"targets to run (of {', '.join(t.name for t in TARGETS)})")
    ap.add_argument("--trace", type=Path, help="the recipes' trace file, if you have it "
                    "(default: the seeded stand-in)")
    ap.add_argument("--stats", action="store_true", help="print the trace's statistics only")
    ap.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    names = {t.name for t in TARGETS}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        ap.error(f"unknown target(s) {', '.join(unknown)}; give any of {', '.join(sorted(names))}")
    if args.trace is not None and not args.trace.is_file():
        ap.error(f"--trace {args.trace} is not a file; give the recipes' .jsonl trace")
    if args.workers < 1:
        ap.error(f"--workers {args.workers} must be at least 1")
    targets = [t for t in TARGETS if not args.only or t.name in args.only]
    with tempfile.TemporaryDirectory() as folder:
        trace = args.trace
        if trace is None:
            trace = Path(folder) / "stand-in.jsonl"
            stand_in(trace)
        stats = trace_stats(trace)
        print(f"trace {'stand-in (seed 0)' if args.trace is None else trace}: "
              f"{stats['rows']:,} rows, input median {stats['input_median']:,.0f}, p99 "
              f"{stats['input_p99']:,.0f}, longest {stats['input_max']:,.0f}; output median "
              f"{stats['output_median']:,.0f}; {stats['reuse']:.1%} of input tokens repeat "
              "an earlier row's prefix", file=sys.stderr, flush=True)
        if args.stats:
            return 0
        jobs = [(t, str(trace)) for t in targets]
        if args.workers > 1 and len(jobs) > 1:
            with ProcessPoolExecutor(max_workers=args.workers) as pool:
                got = list(pool.map(predict, jobs))
        else:
            got = [predict(j) for j in jobs]
    rows = []
    for t, pred in zip(targets, got, strict=True):
        errors = {k: (pred[k] - v) / v for k, v in t.published.items()}
        rows.append({"target": t.name, "source": t.source, "hardware": t.hardware,
                     "concurrency": t.concurrency, "published": t.published,
                     "predicted": pred, "rel_error": errors,
                     "command": f"benchmarks/dynamo_v41.py --only {t.name}"})
        if not args.json:
            cells = "  ".join(f"{k} {v:,.4g} -> {pred[k]:,.4g} ({errors[k]:+.0%})"
                              for k, v in t.published.items())
            print(f"{t.name:<17} c={t.concurrency:<4} {pred['gpus']:>2} GPUs  {cells}  "
                  f"[hits {pred['cache_hit_share']:.0%}]", flush=True)
    if args.json:
        print(json.dumps({"trace": stats, "targets": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
