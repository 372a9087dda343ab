"""`rackplan ui`: serve the Streamlit app on localhost, in the foreground, until interrupted
(Ctrl-C or SIGTERM stop Streamlit too)."""

from __future__ import annotations

import argparse
import importlib.util
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from simulator.specs.errors import SpecError

MAIN = Path(__file__).resolve().parent / "main.py"
"""The app's entry script."""
DEFAULT_PORT = 8501
ADDRESS = "127.0.0.1"


def command(port: int, python: str = sys.executable) -> list[str]:
    """The Streamlit command that serves the app headless on localhost at `port`."""
    return [python, "-m", "streamlit", "run", str(MAIN),
            "--server.headless", "true", "--server.address", ADDRESS,
            "--server.port", str(port), "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "minimal"]


def check_port(port: int) -> None:
    """SpecError unless `port` is a TCP port number."""
    if not 1 <= port <= 65535:
        raise SpecError(f"--port={port} must be a TCP port between 1 and 65535")


def cmd_ui(args: argparse.Namespace) -> int:
    """Run the app until Streamlit exits or the user presses Ctrl-C."""
    check_port(args.port)
    if importlib.util.find_spec("streamlit") is None:
        raise SpecError("the UI needs Streamlit and Plotly; install the ui extra: "
                        "pip install -e '.[ui]'")
    print(f"rackplan ui: http://{ADDRESS}:{args.port} (Ctrl-C stops it)", file=sys.stderr)
    proc = subprocess.Popen(command(args.port))

    def stop(signum: int, frame: FrameType | None) -> None:
        proc.terminate()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `ui` subcommand to the rackplan parser."""
    p = sub.add_parser("ui", help="the Streamlit what-if UI on localhost")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to serve on (default {DEFAULT_PORT})")
    p.set_defaults(func=cmd_ui)
