"""Wide-EP all-to-all: rackplan's DeepEP dispatch / combine prices beside DeepEP's published
microbenchmarks (simulator/calibration/data/deepep_published.csv, transcribed from the
deepseek-ai/DeepEP repository; conditions in deepep_published.md), for each EP size and kernel.

Low-latency kernels: latency per call at 128 tokens per rank, hidden 7168, top-8 of 256 experts,
on H100-class HGX nodes (the h100 preset; DeepEP measured H800 with 400 Gb/s CX7 NICs).
Normal kernels: DeepEP reports the bottleneck bandwidth at 4096 tokens per rank; rackplan's
figure is the same bytes over its predicted time, the bytes being what one rank sends over its
bottleneck link (NVLink inside a node, RDMA across nodes), one copy per destination node under
DeepSeek-V3's 4-node group limit.

Run: .venv/bin/python benchmarks/wide_ep_comm.py
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.calibration import load_calibration  # noqa: E402
from simulator.specs.hardware import load_hardware  # noqa: E402
from simulator.specs.topology import all_to_all_rate  # noqa: E402

DATA = ROOT / "simulator/calibration/data/deepep_published.csv"
EXPERTS = 256
NODE_GROUPS = 4
"""DeepSeek-V3 routes each token to experts on at most 4 nodes (top-4 groups)."""


def main() -> int:
    hw = load_hardware("h100")
    cal = load_calibration(hw, "vllm")
    per = hw.gpus_per_host
    rows = list(csv.DictReader(DATA.open()))
    errors = []
    print(f"{'kernel':<12}{'phase':<9}{'EP':>4}  {'DeepEP':>10}  {'rackplan':>10}  {'error':>7}"
          "  source")
    for r in rows:
        ep, tokens, hidden, topk = (int(r[k]) for k in ("ep", "tokens_per_rank", "hidden",
                                                         "topk"))
        low = r["kernel"] == "low_latency"
        rate = float(all_to_all_rate(ep, min(ep, per), hw.scaleup_gb_s, hw.nic_gb_s))
        got = cal.all_to_all(tokens, hidden, topk, EXPERTS, ep, r["phase"], low, rate)
        ms = float(got.ms[0])
        if low:
            want, ours, unit = float(r["latency_us"]), ms * 1e3, "us"
        else:
            elem = 1.0 if r["phase"] == "dispatch" else 2.0
            nodes = ep // per
            if nodes <= 1:  # NVLink: one copy per destination GPU
                dests = per * (1 - (1 - 1 / per) ** topk) * (per - 1) / per
            else:  # RDMA: one copy per destination node, at most NODE_GROUPS of them
                reach = min(nodes, NODE_GROUPS)
                dests = reach * (nodes - 1) / nodes
            sent = tokens * dests * hidden * elem
            want, ours, unit = float(r["bandwidth_gb_s"]), sent / (ms * 1e-3) / 1e9, "GB/s"
        err = (ours - want) / want
        errors.append(abs(err))
        print(f"{r['kernel']:<12}{r['phase']:<9}{ep:>4}  {want:>7.0f} {unit:<3}{ours:>7.0f} "
              f"{unit:<3} {err:>+6.0%}  {got.source} ({got.table})")
    print(f"mean absolute error {sum(errors) / len(errors):.0%} over {len(errors)} figures; "
          f"worst {max(errors):.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
