"""vLLM's DeepSeek-V4.1-Flash on GB300 figures beside rackplan's prediction for DeepSeek-V4-Flash
(its public relative) on GB300 with fp4 experts: one line per figure, with the relative error and
the command that reproduces the prediction.

Where the report does not say how it measured (batch per rank at DEP32, how an 8K prompt is
spread over two GPUs, what the prefill-only bench counts), the assumption is printed on the
line. The rack line simulates the AgentX workload (the synthetic corpus of AgentX-shaped trees,
docs/agentx.md) on a few whole-rack P/D layouts at a few loads and reports the most tokens/s per
GPU served (cached + uncached input + output, the AgentX convention) among the points where 90 %
of requests get at least 196 tokens/s; `--no-rack` skips it (it simulates for a few minutes).

Run: .venv/bin/python benchmarks/report_figures.py [--json] [--no-rack]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.stepcalc import step_report  # noqa: E402
from simulator.calibration import load_calibration  # noqa: E402
from simulator.specs.hardware import load_hardware  # noqa: E402
from simulator.specs.model import load_model  # noqa: E402

NARROW = "examples/deepseek-v4-flash-gb300-dep.yaml"  # prefill DEP2, decode DEP4
WIDE = "examples/deepseek-v4-flash-gb300-dep-wide.yaml"  # prefill DEP4, decode DEP32
LOW_LATENCY = "examples/deepseek-v4-flash-gb300-low-latency.yaml"  # decode TP4, MTP 3
AGENTIC = "benchmarks/workloads/prefill-agentic-256.yaml"
PREFILL = {dep: f"examples/deepseek-v4-flash-gb300-prefill-dep{dep}.yaml" for dep in (2, 4)}
"""One prefill instance at each DEP size, benched alone (single-role bench decks)."""
PREFILL_NOTE = ("one instance at 256 AgentX lanes; computed (uncached) prompt tokens per GPU: "
                "when every input token of the rack's 954K tok/s/GPU passes a prefill instance, "
                "the 64.4K cannot count cached ones")


@dataclass
class Figure:
    name: str
    published: float | None
    unit: str
    predict: Callable[[], float | None]
    command: str
    note: str = ""


def _step(path: str, role: str, batch: int, context: int, cached: int = 0,
          busy: int | None = None) -> dict[str, Any]:
    return step_report(ROOT / path, role, batch, context, cached, busy)


def _kernel_share(batch: int, context: int, dep: int) -> float:
    """Share of a decode step spent in V4's attention and indexer kernels alone (no
    projections): the HCA attention kernel for HCA layers, the indexer kernel for CSA layers,
    and, for CSA's attention over window + top-k entries and SWA's over the window, the HCA
    attention kernel at a context with as many entries (a stand-in: no CSA kernel table
    ships)."""
    from simulator.cost.step import Instance

    m, hw = load_model("deepseek-v4-flash"), load_hardware("gb300")
    cal = load_calibration(hw, "vllm")
    inst = Instance(model=m, hardware=hw, role="decode", ranks=dep, expert_parallel=True,
                    weights="fp4", kv_cache="fp8", indexer_cache="fp4")
    b, one = np.array([float(batch)]), np.array([1.0])

    def attn(ctx: float) -> float:
        return float(cal.dsv4_kernel("dsv4_hca_attn", inst, b, one, np.array([ctx])).ms[0])

    kinds = dict(m.layer_kinds)
    csa_entries_ctx = (m.sparse_topk) * 128  # HCA reads window + ctx/128 entries
    ms = (kinds.get("hca", 0) * attn(context) + kinds.get("swa", 0) * attn(1.0)
          + kinds.get("csa", 0) * (attn(csa_entries_ctx) + float(cal.dsv4_kernel(
              "dsv4_indexer", inst, b, one, np.array([float(context)])).ms[0])))
    total = _step(NARROW, "decode", batch, context)["total_ms"]
    return ms / total


def _moe_share(path: str, batch: int, context: int) -> float:
    r = _step(path, "decode", batch, context)
    b = r["breakdown_ms"]
    return (b["moe"] + b["communication"]) / r["total_ms"]


_PREFILL_RUNS: dict[int, dict[str, Any]] = {}


def _prefill(dep: int, key: str) -> float:
    """A metric of the prefill-only bench on a rack of DEP`dep` instances (simulated once)."""
    from planner.evaluate import sim_options
    from simulator.des import simulate
    from simulator.specs.loading import load_deployment, load_workload

    if dep not in _PREFILL_RUNS:  # as `rackplan simulate` runs it (serving latencies included),
        # with the DP wait priced on every step instead of every 32nd
        deployment = load_deployment(ROOT / PREFILL[dep])
        options = dataclasses.replace(sim_options(deployment), dp_wait_every=1)
        _PREFILL_RUNS[dep] = simulate(deployment, load_workload(ROOT / AGENTIC),
                                      options=options).metrics()
    return float(_PREFILL_RUNS[dep][key])


RACK_LAYOUTS = ((20, 2), (28, 1))
"""(prefill DEP2 instances, decode DEP16 instances) of the rack layouts tried: all 72 GPUs, the
report's DEP2 prefill, decode at 256 sequences per rank with 3 MTP tokens."""
RACK_ROUTERS = ("prefix_aware", "session_affinity")
"""Prefill router policies tried (the report does not say which it ran)."""
RACK_LOADS = (2048, 4096)
"""Session lanes tried; each run measures 3 turns per lane after the warmup turns."""
RACK_SPEED = 196.0
_RACK: dict[str, Any] = {}


def _rack_point(point: tuple[int, int, str, int]) -> dict[str, Any]:
    from simulator.des import simulate
    from simulator.specs.deployment import Deployment, Precision, RoleSpec, Speculative
    from simulator.specs.workload import SessionsArrival, Workload

    prefill, decode, router, lanes = point
    d = Deployment(model="deepseek-v4-flash", hardware="gb300", gpus=72,
                   precision=Precision(weights="fp4", kv_cache="fp8", indexer_cache="fp4"),
                   prefill=RoleSpec(instances=prefill, dep=2, max_num_batched_tokens=16384,
                                    router=router),
                   decode=RoleSpec(instances=decode, dep=16, max_num_seqs=256,
                                   redundant_experts=16,
                                   speculative=Speculative(tokens=3, acceptance=0.8)))
    m = simulate(d, Workload(arrival=SessionsArrival(concurrency=lanes),
                             requests=3 * lanes)).metrics()
    return {"prefill": prefill, "decode": decode, "router": router, "lanes": lanes, **m}


def _rack() -> float | None:
    """The best served tok/s/GPU at P90 >= 196 tok/s/user over the rack layouts, prefill
    routers and loads."""
    from concurrent.futures import ProcessPoolExecutor

    from planner.objectives import metric_value

    if "best" not in _RACK:
        points = [(p, d, r, n) for p, d in RACK_LAYOUTS for r in RACK_ROUTERS
                  for n in RACK_LOADS]
        with ProcessPoolExecutor(max_workers=2) as pool:
            runs = list(pool.map(_rack_point, points))
        for r in runs:
            speed = metric_value(r, "tok_s_user_p90") or 0.0
            print(f"  rack P {r['prefill']}xDEP2 ({r['router']}) + D {r['decode']}xDEP16, "
                  f"{r['lanes']} lanes: "
                  f"{r['throughput_tok_s_gpu']:,.0f} tok/s/GPU, 90 % of requests >= "
                  f"{speed:.0f} tok/s, TTFT p90 {r['ttft_ms']['p90'] / 1e3:.1f} s, cache hits "
                  f"{r['cache_hit_share']:.1%}", file=sys.stderr, flush=True)
        ok = [r for r in runs if (metric_value(r, "tok_s_user_p90") or 0.0) >= RACK_SPEED]
        _RACK["best"] = max(ok, key=lambda r: r["throughput_tok_s_gpu"]) if ok else None
    best = _RACK["best"]
    return None if best is None else float(best["throughput_tok_s_gpu"])


def _single_user() -> float:
    """Tokens/s of one user on the low-latency deck: accepted tokens per step over the step
    (tokens/s/GPU at batch 1 times the instance's GPUs)."""
    r = _step(LOW_LATENCY, "decode", 1, 8192)
    return float(r["tokens_per_s_per_gpu"]) * int(r["ranks"])


FIGURES = [
    Figure("DEP4 decode 128K, 64 req/rank: MoE share of step", 0.62, "share",
           lambda: _moe_share(NARROW, 64, 131072),
           f"rackplan step {NARROW} --batch 64 --context 131072 --json",
           "MoE = expert GEMMs + router + shared experts + dispatch/combine"),
    Figure("DEP4 decode 128K, 64 req/rank: attention + indexer share", 0.13, "share",
           lambda: _kernel_share(64, 131072, 4),
           "benchmarks/report_figures.py (dsv4_hca_attn + dsv4_indexer kernel tables)",
           "kernels only; projections excluded"),
    Figure("DEP32 decode step at 128K", 8.93, "ms",
           lambda: _step(WIDE, "decode", 64, 131072)["total_ms"],
           f"rackplan step {WIDE} --batch 64 --context 131072 --json",
           "assumes 64 requests per rank, as the DEP4 figure"),
    Figure("DEP32 decode step at 855K", 9.53, "ms",
           lambda: _step(WIDE, "decode", 64, 855000)["total_ms"],
           f"rackplan step {WIDE} --batch 64 --context 855000 --json",
           "assumes 64 requests per rank"),
    Figure("DEP32 decode growth 128K -> 855K", 9.53 / 8.93, "ratio",
           lambda: (_step(WIDE, "decode", 64, 855000)["total_ms"]
                    / _step(WIDE, "decode", 64, 131072)["total_ms"]),
           f"rackplan step {WIDE} --batch 64 --context 855000|131072 --json"),
    Figure("prefill-only c=256 agentic: DEP2 tok/s/GPU", 64_400, "tok/s/GPU",
           lambda: _prefill(2, "prefill_computed_tok_s_gpu"),
           f"rackplan simulate {PREFILL[2]} --workload {AGENTIC} --json "
           "(prefill_computed_tok_s_gpu)", PREFILL_NOTE),
    Figure("prefill-only c=256 agentic: DEP4 tok/s/GPU", 53_300, "tok/s/GPU",
           lambda: _prefill(4, "prefill_computed_tok_s_gpu"),
           f"rackplan simulate {PREFILL[4]} --workload {AGENTIC} --json "
           "(prefill_computed_tok_s_gpu)", PREFILL_NOTE),
    Figure("prefill-only: DEP4 / DEP2 per GPU", 53_300 / 64_400, "ratio",
           lambda: (_prefill(4, "prefill_computed_tok_s_gpu")
                    / _prefill(2, "prefill_computed_tok_s_gpu")),
           "the two simulate lines above"),
    Figure("prefill-only: DP imbalance cost, DEP2", 0.059, "share",
           lambda: _prefill(2, "dp_imbalance"),
           f"rackplan simulate {PREFILL[2]} --workload {AGENTIC} --json (dp_imbalance)",
           "GPU time ranks wait for a busier rank's attention"),
    Figure("prefill-only: DP imbalance cost, DEP4", 0.136, "share",
           lambda: _prefill(4, "dp_imbalance"),
           f"rackplan simulate {PREFILL[4]} --workload {AGENTIC} --json (dp_imbalance)",
           "GPU time ranks wait for a busier rank's attention"),
    Figure("8K prefill on 2 GPUs, no prior context", 87.9, "ms",
           lambda: _step(NARROW, "prefill", 1, 4096)["total_ms"],
           f"rackplan step {NARROW} --role prefill --batch 1 --context 4096 --json",
           "8K tokens spread 4K per rank of DEP2"),
    Figure("8K prefill on 2 GPUs after 512K cached", 189.4, "ms",
           lambda: _step(NARROW, "prefill", 1, 4096, 524288)["total_ms"],
           f"rackplan step {NARROW} --role prefill --batch 1 --context 4096 --cached 524288 "
           "--json", "4K per rank, each after 512K cached"),
    Figure("single-user decode", 826, "tok/s",
           _single_user,
           f"rackplan step {LOW_LATENCY} --batch 1 --context 8192 --json",
           "TP4 + 3 MTP tokens at 0.8 acceptance (assumed), the general decode path; the "
           "report's specialised path has no measured table"),
    Figure("rack: tok/s/GPU at P90 196 tok/s/user", 954_000, "tok/s/GPU", _rack,
           "benchmarks/report_figures.py (rack layouts x loads, agentx sessions)",
           "best of P 20/28 x DEP2 + D 2/1 x DEP16, prefix_aware / session_affinity, 2,048 / "
           "4,096 lanes; prefill-bound: cold subagent starts, new tails and routing misses"),
]


def _fmt(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-rack", action="store_true", help="skip the rack line (minutes)")
    args = ap.parse_args()
    rows = []
    for f in FIGURES:
        if args.no_rack and f.predict is _rack:
            continue
        got = f.predict()
        err = None if got is None or f.published is None else (got - f.published) / f.published
        rows.append({"figure": f.name, "published": f.published, "predicted": got,
                     "unit": f.unit, "rel_error": err, "command": f.command, "note": f.note})
        if not args.json:
            e = "-" if err is None else f"{err:+.0%}"
            print(f"{f.name:<52} published {_fmt(f.published):>9}  rackplan {_fmt(got):>9} "
                  f"{f.unit:<9} {e:>6}   {f.command}" + (f"   [{f.note}]" if f.note else ""),
                  flush=True)
    if args.json:
        print(json.dumps({"figures": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
