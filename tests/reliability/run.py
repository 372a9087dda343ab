"""Running the bad-input cases as real `rackplan` subprocesses, and the table they make.

Each case runs in its own temporary folder (its working directory, so default outputs such as
runs/plan.yaml land there) under a wall-clock limit and an address-space cap; what it printed is
reduced to its exit code and the last line on stderr, with the folder's path written <tmp> and
the repository's dropped, so the table reads the same on every machine.

`python -m tests.reliability.run --write` regenerates docs/reliability.md; the test fails when the
file differs from what the cases produce now.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.reliability.cases import CASES, TINY, WORK, Case, _yaml

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
TIMEOUT_S = 60.0
"""Wall-clock limit of one case: every refusal comes before any real work, well under a second
of it; a case still running at 60 s hangs."""
MEMORY_BYTES = 4 << 30
"""Address-space cap of one case (RLIMIT_AS, 4 GiB): start-up with torch and numpy maps well
under it; a case that grows without bound dies on it instead of taking the machine."""
PARALLEL = 4
"""Cases run at once (each is one short process, most of it interpreter start-up)."""
ERROR_LINE = re.compile(r"^rackplan(?: [\w-]+)?: error: ")
"""How the line that refuses bad input starts (ours, or argparse's for a subcommand)."""


@dataclass(frozen=True)
class Outcome:
    """What one case did."""

    case: Case
    returncode: int | None
    """None: still running at TIMEOUT_S (killed)."""
    stdout: str
    stderr: str
    leftovers: tuple[str, ...]
    """Temporary files (*.tmp, probes) left in the case's folder, relative to it."""

    @property
    def message(self) -> str:
        """The last line on stderr (the refusal), or what happened instead."""
        if self.returncode is None:
            return f"(no answer in {TIMEOUT_S:.0f} s)"
        lines = [x for x in self.stderr.splitlines() if x.strip()]
        return lines[-1].strip() if lines else "(nothing on stderr)"

    def problems(self) -> list[str]:
        """Why this outcome is not one clear refusal (empty when it is)."""
        out = []
        if self.returncode is None:
            out.append(f"no answer within {TIMEOUT_S:.0f} s")
        elif self.returncode == 0:
            out.append("accepted (exit 0)")
        elif self.returncode < 0:
            out.append(f"killed by signal {-self.returncode}")
        if "Traceback" in self.stderr or "Traceback" in self.stdout:
            out.append("a traceback")
        lines = [x for x in self.stderr.splitlines() if x.strip()]
        extra = [x for x in lines[:-1] if not (x.startswith("usage:") or x.startswith(" "))]
        if self.returncode is not None and not ERROR_LINE.match(self.message):
            out.append("last stderr line is not 'rackplan: error: ...'")
        elif extra:
            out.append(f"{len(extra)} more line(s) on stderr than the refusal")
        if shown(self.case.needle) not in self.message:
            out.append(f"message does not name {shown(self.case.needle)!r}")
        if self.leftovers:
            out.append(f"left behind {', '.join(self.leftovers)}")
        return out


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def _expand(text: str, tmp: Path) -> str:
    return text.replace("{tmp}", str(tmp)).replace("{repo}", str(REPO))


def shown(text: str, tmp: Path | None = None) -> str:
    """`text` with machine-specific paths replaced: the case folder by <tmp>, the repository's
    by nothing (examples/... reads as run from the checkout)."""
    if tmp is not None:
        for form in {str(tmp), os.path.realpath(tmp)}:
            text = text.replace(form, "<tmp>")
    text = text.replace("{tmp}", "<tmp>").replace("{repo}/", "")
    return text.replace(f"{REPO}/", "").replace(str(REPO), ".")


def command_text(case: Case) -> str:
    """The command as the table shows it."""
    return "rackplan " + " ".join(_quote(shown(a)) for a in case.short or case.argv)


GOOD = {"d.yaml": _yaml(TINY), "w.yaml": _yaml(WORK)}
"""Files a case holds that are not the bad input (the good deployment and workload)."""


def input_text(case: Case, width: int = 70) -> str:
    """The bad input in a few words: `case.what`, else each file that is not a good one."""
    if case.what:
        return shown(case.what)
    parts = []
    for name, content in case.files.items():
        if GOOD.get(name) == content:
            continue
        if name.endswith("/"):
            parts.append(f"{name} (a folder)")
            continue
        text = content.decode("latin-1") if isinstance(content, bytes) else content
        text = repr(text)[1:-1] if isinstance(content, bytes) else " ".join(text.split())
        text = shown(text)
        parts.append(f"{name}: " + (text if len(text) <= width else text[:width - 3] + "..."))
    return "; ".join(parts)


def _quote(arg: str) -> str:
    return arg if re.fullmatch(r"[\w@%+=:,./<>*-]+", arg) else shlex.quote(arg)


def run_case(case: Case) -> Outcome:
    """Run one case in a fresh folder and collect what it did."""
    tmp = Path(tempfile.mkdtemp(prefix="rackplan-rel-"))
    try:
        for name, content in case.files.items():
            path = tmp / name
            if name.endswith("/"):
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            text = _expand(content, tmp) if isinstance(content, str) else content
            if isinstance(text, str):
                path.write_text(text, encoding="utf-8")
            else:
                path.write_bytes(text)
        before = {p for p in tmp.rglob("*")}
        argv = [sys.executable, "-m", "planner.cli", *(_expand(a, tmp) for a in case.argv)]
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160",
               "HF_HUB_CACHE": str(tmp / "hf-cache")}
        env.pop("RACKPLAN_CALIBRATION_DIR", None)
        proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                preexec_fn=_limit_memory, start_new_session=True)
        code: int | None
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
            _end_group(proc.pid)
            out, err = proc.communicate()
        finally:
            _end_group(proc.pid)  # whatever the case started (worker pools) ends with it
        left = tuple(sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")
                            if p not in before and (p.name.endswith(".tmp")
                                                    or p.name.startswith(".rackplan-probe-"))))
        return Outcome(case, code, shown(out, tmp), shown(err, tmp), left)
    finally:
        for p in [tmp, *tmp.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(tmp, ignore_errors=True)


def _end_group(pgid: int) -> None:
    """Kill the case's process group: the command and every process it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_all(cases: Sequence[Case] = CASES, parallel: int = PARALLEL) -> list[Outcome]:
    """Every case's outcome, in the table's order."""
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(run_case, cases))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def table(outcomes: Iterable[Outcome]) -> str:
    """docs/reliability.md's text."""
    outcomes = list(outcomes)
    bad = [o for o in outcomes if o.problems()]
    lines = [
        "# Reliability: bad input, one clear line",
        "",
        "Every row is a bad input a hostile user tried, run through the real command line by",
        "`tests/reliability` (each case a subprocess with a 60 s limit and a 4 GiB address-space",
        "cap). A row passes when the command exits non-zero within the limit, prints no",
        "traceback, ends stderr with one `rackplan: error:` line that names the offending value,",
        "and leaves no temporary file behind. `<tmp>` stands for the case's own scratch folder;",
        "`search ...` for `search --model tiny-moe --hardware cpu --gpus 8 --workload",
        "<tmp>/w.yaml --trials 1 --storage sqlite:///<tmp>/s.db --out <tmp>/plan.yaml`, each",
        "flag of the row replacing the base's own; `input` is what the case's files hold where",
        "they differ from a good tiny-moe deployment (d.yaml) and workload (w.yaml).",
        "",
        "Generated by `python -m tests.reliability.run --write`; the test fails when this file",
        "differs from what the cases print.",
        "",
        f"{len(outcomes)} cases, {len(outcomes) - len(bad)} refused in one clear line"
        + (f", {len(bad)} not yet (marked)." if bad else "."),
        "",
        "| # | class | command | input | exit | message |",
        "|---|---|---|---|---|---|",
    ]
    for i, o in enumerate(outcomes, 1):
        code = "timeout" if o.returncode is None else str(o.returncode)
        mark = ""
        if o.problems():
            why = f"; to fix in {o.case.known}" if o.case.known else ""
            mark = " (not yet: " + "; ".join(o.problems()) + why + ")"
        given = input_text(o.case)
        lines.append(f"| {i} | {o.case.kind} | `{_cell(command_text(o.case))}` | "
                     f"{'`' + _cell(given) + '`' if given else ''} | {code} | "
                     f"{_cell(o.message)}{_cell(mark)} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {DOC.relative_to(REPO)}")
    parser.add_argument("-k", metavar="TEXT", help="only the cases whose command holds TEXT")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.k or args.k in " ".join(c.argv) + c.kind]
    outcomes = run_all(cases)
    for i, o in enumerate(outcomes, 1):
        flag = "FAIL" if o.problems() else "ok"
        print(f"{i:3} {flag:4} [{o.case.kind}] {command_text(o.case)}\n      -> "
              f"{o.returncode} {o.message}" + "".join(f"\n      !! {p}" for p in o.problems()))
    if args.write:
        if args.k:
            parser.error("--write needs every case; drop -k")
        DOC.write_text(table(outcomes), encoding="utf-8")
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
