"""Golden files of rendered command lines: compare, or rewrite with RACKPLAN_UPDATE_GOLDEN=1.

    RACKPLAN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/executor -k golden

rewrites every golden file a test compares against (then review `git diff tests/`)."""

import os
from pathlib import Path

from executor.records import Rendered

GOLDEN = Path(__file__).parent / "golden"
UPDATE_ENV = "RACKPLAN_UPDATE_GOLDEN"


def command_lines(rendered: Rendered) -> str:
    """One shell line per process, as the golden files hold them."""
    return "\n".join(p.command_line() for p in rendered.processes) + "\n"


def assert_golden(name: str, got: str) -> None:
    """`got` equals golden/NAME; with RACKPLAN_UPDATE_GOLDEN=1 the file is rewritten instead."""
    path = GOLDEN / name
    if os.environ.get(UPDATE_ENV) == "1":
        path.write_text(got)
        return
    assert path.is_file(), f"no golden file {path.name}; write it with {UPDATE_ENV}=1"
    assert got == path.read_text()
