"""Running the real `rackplan` CLI in a subprocess, and what a bad-input error must look like."""

import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, timeout=120)


def assert_one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit code 2, nothing on stdout, one line on stderr holding every needle, no traceback."""
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
