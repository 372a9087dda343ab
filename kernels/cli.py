"""`rackplan calibrate`: measure this machine's kernels and write calibration tables.

`register(sub)` adds the subcommand to the `rackplan` parser; torch is imported only when the
command runs, so the rest of the CLI works without it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kernels.shapes import OPS
from simulator.specs.errors import SpecError
from simulator.specs.paths import writable

DEFAULT_MODEL = {"cpu": "tiny-moe", "cuda": "deepseek-v3"}
INSTALL_HINT = "pip install 'rackplan[kernels]'"


def _ops(text: str | None) -> tuple[str, ...]:
    if not text:
        return OPS
    ops = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise SpecError(f"--only={text!r} names {', '.join(map(repr, bad)) or 'nothing'}; "
                        f"valid: {', '.join(OPS)}")
    return ops


def _default_device() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.from_run is not None:
        return _from_run(args)
    device = args.device or _default_device()
    if device not in DEFAULT_MODEL:
        raise SpecError(f"--device={device!r} is not one of {', '.join(DEFAULT_MODEL)}")
    ops = _ops(args.only)
    if args.max_seconds is not None and not 0 < args.max_seconds < math.inf:
        raise SpecError(f"--max-seconds={args.max_seconds} must be a positive, finite number "
                        "of seconds")
    if args.threads is not None and args.threads < 1:
        raise SpecError(f"--threads={args.threads} must be >= 1")
    try:
        from kernels.calibrate import calibrate
    except ImportError as e:
        raise SpecError(f"rackplan calibrate needs torch ({e.name} is not installed); "
                        f"{INSTALL_HINT}") from None
    model = args.model or DEFAULT_MODEL[device]
    out = args.out or f"runs/calibration/{device}-{re.sub(r'[^A-Za-z0-9._-]+', '_', model)}"
    writable(out, "--out", folder=True)
    with Progress(TextColumn("calibrating {task.fields[label]}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True),
                  transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("calibrate", total=None, label="")

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, label=label)

        manifest = calibrate(device, model, args.quick, out, ops, args.max_seconds, progress,
                             args.threads)
    if args.json:
        sys.stdout.write(json.dumps(_brief(manifest, out), indent=2) + "\n")
        return 0
    _print(manifest, out)
    return 0


def _from_run(args: argparse.Namespace) -> int:
    """calibrate --from-run RUN_DIR --out DIR: the serving latencies of a bench run."""
    from kernels.from_run import fit_from_run

    if args.out is None:
        raise SpecError("--from-run needs --out DIR: the calibration folder whose "
                        "serving_overhead.json gets the fitted latencies")
    given = [f"--{k.replace('_', '-')}" for k in ("device", "model", "only", "max_seconds",
                                                  "threads") if getattr(args, k) is not None]
    if given or args.quick:
        raise SpecError(f"--from-run fits from a bench run and measures no kernels; it takes "
                        f"no {(given or ['--quick'])[0]}")
    out = writable(args.out, "--out", folder=True)
    fitted = fit_from_run(args.from_run, out)
    if args.json:
        sys.stdout.write(json.dumps(fitted, indent=2) + "\n")
        return 0
    print(f"fitted from {fitted['run']} (concurrency {fitted['concurrency']}): step overhead "
          f"{fitted['step_overhead_ms']:.3f} ms, API overhead {fitted['api_overhead_ms']:.3f} ms"
          + (f", P/D handoff {fitted['handoff_ms']:.3f} ms" if "handoff_ms" in fitted else ""))
    print(f"written: {fitted['file']} (read by rackplan simulate --calibration {out})")
    return 0


def _brief(m: dict[str, Any], out: str) -> dict[str, Any]:
    """The manifest without its shape lists (they stay in manifest.json)."""
    return {**{k: v for k, v in m.items() if k != "shapes"}, "out": out}


def _print(m: dict[str, Any], out: str) -> None:
    c = Console() if sys.stdout.isatty() else Console(width=160)
    dev = m["device"]
    c.print(f"[bold]calibrated[/] {m['model']} on {dev['name']} ({dev['kind']}, "
            f"{dev['threads']} threads) in {m['wall_time_s']:.1f} s; checks passed: "
            f"{', '.join(m['checks_passed']) or 'none'}")
    t = Table(title=f"tables in {out}")
    t.add_column("table")
    t.add_column("rows", justify="right")
    t.add_column("file")
    for table, n in m["rows"].items():
        t.add_row(table, str(n), m["tables"][table])
    c.print(t)
    for k, v in m["summary"].items():
        c.print(f"  {k}: {v:g}")
    for what, why in m["skipped"].items():
        c.print(f"  skipped {what}: {why}")
    if m["unfinished"]:
        c.print(f"  [yellow]time budget spent; unfinished: {', '.join(m['unfinished'])}[/]")


def register(sub: Any) -> None:
    """Add `calibrate` to the rackplan subcommands."""
    p = sub.add_parser("calibrate", help="measure this machine's kernels into calibration tables")
    p.add_argument("--device", help="cpu or cuda (default: cuda when torch sees a GPU, else cpu)")
    p.add_argument("--model", help="model preset or config.json whose shapes to sweep "
                                    "(default: tiny-moe on cpu, deepseek-v3 on cuda)")
    p.add_argument("--quick", action="store_true",
                   help="a small sweep (CI: well under a minute on 2 CPU cores)")
    p.add_argument("--out", help="calibration folder to write (replaced atomically; default "
                                 "runs/calibration/DEVICE-MODEL)")
    p.add_argument("--only", metavar="OPS", help=f"comma-separated subset of {', '.join(OPS)}")
    p.add_argument("--max-seconds", type=float,
                   help="stop sweeping once this much wall time is spent; what was measured is "
                        "written and the manifest lists what is unfinished")
    p.add_argument("--threads", type=int,
                   help="torch intra-op threads (default: every core the process may use)")
    p.add_argument("--from-run", metavar="RUN_DIR",
                   help="measure no kernels: fit the serving stack's per-step, API and P/D "
                        "handoff latencies from a `rackplan bench --out RUN_DIR` run into "
                        "--out DIR's serving_overhead.json")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_calibrate)
