"""The `rackplan` command line.

Every subcommand prints for people by default and one JSON object with `--json`. Bad input gives
one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from simulator.specs.errors import SpecError

EXIT_BAD_INPUT = 2


def _console() -> Console:
    """Rich console; wide enough for the tables when stdout is a file or a pipe."""
    return Console() if sys.stdout.isatty() else Console(width=160)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def cmd_models(args: argparse.Namespace) -> int:
    from simulator.specs.model import load_model, preset_names

    rows: list[dict[str, Any]] = []
    for name in preset_names():
        m = load_model(name)
        rows.append({
            "name": name, "architecture": m.architecture, "params_b": m.total_params() / 1e9,
            "active_params_b": m.active_params() / 1e9, "layers": m.layers,
            "attention": m.attention, "routed_experts": m.n_routed_experts, "top_k": m.top_k,
            "mtp_layers": m.mtp_layers, "kv_bytes_per_token_fp8": m.kv_bytes_per_token("fp8"),
        })
    if args.json:
        _print_json({"models": rows})
        return 0
    t = Table(title="model presets")
    for col in ("name", "architecture", "params", "active", "layers", "attention", "experts",
                "top-k", "MTP", "KV B/token (fp8)"):
        t.add_column(col, justify="left" if col in ("name", "architecture") else "right")
    for r in rows:
        t.add_row(r["name"], r["architecture"], f"{r['params_b']:.1f}B",
                  f"{r['active_params_b']:.2f}B", str(r["layers"]), r["attention"],
                  str(r["routed_experts"]), str(r["top_k"]), str(r["mtp_layers"]),
                  f"{r['kv_bytes_per_token_fp8']:,.0f}")
    _console().print(t)
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from simulator.specs.hardware import HARDWARE

    rows = [h.model_dump() for h in HARDWARE.values()]
    if args.json:
        _print_json({"hardware": rows})
        return 0
    t = Table(title="hardware presets (dense peak per GPU)")
    for col in ("name", "bf16 TF/s", "fp8 TF/s", "fp4 TF/s", "HBM GB", "HBM TB/s",
                "scale-up", "NVLink GB/s", "NIC GB/s", "$/GPU-h", "measured tables"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for h in HARDWARE.values():
        pk = h.peak_tflops
        t.add_row(h.name, *(f"{pk[d]:,.0f}" if d in pk else "-" for d in ("bf16", "fp8", "fp4")),
                  f"{h.hbm_gb:.0f}", f"{h.hbm_tb_s:.2f}", str(h.scaleup_domain),
                  f"{h.scaleup_gb_s:.0f}", f"{h.nic_gb_s:.0f}", f"{h.usd_per_gpu_hour:.2f}",
                  h.system or "none (calibrate)")
    _console().print(t)
    return 0


def cmd_step(args: argparse.Namespace) -> int:
    from planner.stepcalc import step_report

    report = step_report(args.deployment, args.role, args.batch, args.context)
    if args.json:
        _print_json(report)
        return 0
    c = _console()
    c.print(f"[bold]{report['model']}[/] on {report['hardware']} ({report['engine']}), "
            f"{args.role} instance {report['layout']}: {args.batch} requests per rank, "
            f"context {args.context}")
    t = Table(title=f"step time {report['total_ms']:.3f} ms "
                    f"({report['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU)")
    t.add_column("part")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    for k, v in report["breakdown_ms"].items():
        t.add_row(k, f"{v:.3f}", f"{v / report['total_ms']:.1%}")
    c.print(t)
    p = Table(title="provenance")
    p.add_column("operation")
    p.add_column("source")
    for k, v in report["provenance"].items():
        p.add_row(k, v)
    c.print(p)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rackplan",
        description="Plan, predict and deploy P/D-disaggregated, wide-EP MoE serving on vLLM.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list the model presets")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("hardware", help="list the hardware presets")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_hardware)

    p = sub.add_parser("step", help="price one engine step of one instance of a deployment")
    p.add_argument("deployment", help="deployment YAML (DESIGN.md format)")
    p.add_argument("--role", choices=["prefill", "decode", "aggregated"], default="decode",
                   help="which role's instance to price (default decode)")
    p.add_argument("--batch", type=int, default=128,
                   help="requests per rank in the step (default 128)")
    p.add_argument("--context", type=int, default=4096,
                   help="decode: KV length per request; prefill: prompt tokens per request "
                        "(default 4096)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_step)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except SpecError as e:
        print(f"rackplan: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("rackplan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
