"""`rackplan ui`: the command it runs, and one-line errors."""

from __future__ import annotations

import sys

from app.cli import MAIN, command
from planner.cli import build_parser
from tests.planner.cli_run import assert_one_line_error, run_cli


def test_command_serves_headless_on_localhost() -> None:
    argv = command(8765)
    assert argv[:4] == [sys.executable, "-m", "streamlit", "run"]
    assert argv[4] == str(MAIN) and MAIN.is_file()
    flags = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert flags == {"--server.headless": "true", "--server.address": "127.0.0.1",
                     "--server.port": "8765", "--browser.gatherUsageStats": "false",
                     "--client.toolbarMode": "minimal"}


def test_parser_has_ui() -> None:
    args = build_parser().parse_args(["ui", "--port", "9001"])
    assert args.port == 9001 and args.func.__name__ == "cmd_ui"
    assert build_parser().parse_args(["ui"]).port == 8501


def test_bad_port_is_one_line() -> None:
    assert_one_line_error(run_cli("ui", "--port", "70000"), "--port=70000", "65535")
