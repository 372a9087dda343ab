"""Rendered `vllm serve` flags checked with vLLM's own argument parser.

vLLM lives in its own environment (.venv-engine at the repository root, built by
executor/engine_env.sh), so the check runs there as a subprocess:

    .venv-engine/bin/python executor/vllm_args.py --check FILE

FILE is JSON, {"processes": [{"name": "decode-0 host 1", "argv": ["vllm", "serve", ...]}]}.
The script builds the parser `vllm serve` uses (`make_arg_parser(FlexibleArgumentParser())`),
parses each process's argv[2:] (the model, then the flags) and prints one JSON object: vLLM's
version and, per process, one error per unknown or invalid flag. It is run by path rather than
with `-m` because importing the `executor` package pulls in rackplan's own dependencies, which
the engine environment does not have. Only argument parsing is checked (and vLLM's quick
post-parse checks): building the engine configuration would refuse GPU-only features on a
machine without a GPU.

In rackplan's own environment, `check_with_vllm` writes FILE, runs the script with the engine
interpreter and returns the errors, or a note saying why the check was skipped.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

ENGINE_VENV = ".venv-engine"
"""The engine environment's folder, at the repository root."""
CHECK_TIMEOUT_S = 600.0
"""Importing vLLM takes tens of seconds on a small machine."""
PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")
"""Where `make_arg_parser` lives: vLLM 0.32 first, then the older location."""

_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class FlagError:
    """One flag of one process that vLLM's parser refuses."""

    process: str
    """e.g. decode-0 host 1."""
    flag: str
    """The flag as given (e.g. --max-num-seqs); empty when vLLM names none."""
    message: str
    """vLLM's reason, on one line."""

    def __str__(self) -> str:
        return f"{self.process}: {self.flag}: {self.message}" if self.flag else \
            f"{self.process}: {self.message}"


@dataclass(frozen=True)
class VllmCheck:
    """What vLLM's parser said about every process, or why it was not asked."""

    errors: tuple[FlagError, ...] = ()
    skipped: str | None = None
    """Why the check did not run (no engine environment, vLLM not importable); None if it ran."""
    vllm_version: str | None = None


def engine_python(root: Path | None = None) -> Path | None:
    """The engine environment's interpreter, or None when that environment is absent."""
    python = (root or _ROOT) / ENGINE_VENV / "bin" / "python"
    return python if python.is_file() else None


def check_with_vllm(processes: Iterable[tuple[str, Sequence[str]]], python: Path | None = None,
                    timeout_s: float = CHECK_TIMEOUT_S) -> VllmCheck:
    """Parse each (name, argv) with vLLM's own parser in the engine environment; `python`
    defaults to .venv-engine/bin/python at the repository root."""
    python = python or engine_python()
    if python is None:
        return VllmCheck(skipped=f"no engine environment at {ENGINE_VENV}/ (build it with "
                                 "executor/engine_env.sh); vLLM's own flag check skipped")
    doc = {"processes": [{"name": name, "argv": list(argv)} for name, argv in processes]}
    with tempfile.TemporaryDirectory(prefix="rackplan-vllm-args-") as tmp:
        path = Path(tmp) / "processes.json"
        path.write_text(json.dumps(doc), encoding="utf-8")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
        try:
            run = subprocess.run([str(python), str(Path(__file__).resolve()), "--check",
                                  str(path)], capture_output=True, text=True, env=env,
                                 cwd=tmp, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return VllmCheck(skipped=f"vLLM's flag check did not finish within {timeout_s:g} s")
    try:
        out = json.loads(run.stdout.strip().splitlines()[-1]) if run.stdout.strip() else None
    except json.JSONDecodeError:
        out = None
    if not isinstance(out, dict):
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return VllmCheck(skipped=f"vLLM's flag check failed to run ({tail})")
    if out.get("skipped"):
        return VllmCheck(skipped=str(out["skipped"]))
    errors = tuple(FlagError(p["name"], e["flag"], e["message"])
                   for p in out["processes"] for e in p["errors"])
    return VllmCheck(errors=errors, vllm_version=out.get("vllm"))


# --- what runs inside the engine environment -------------------------------------------------


class _ParserError(Exception):
    """argparse's error, raised instead of exiting."""


def build_parser() -> argparse.ArgumentParser:
    """vLLM's `vllm serve` parser, with errors raised instead of exiting (imports vLLM)."""
    base: type[argparse.ArgumentParser] = import_module(
        "vllm.utils.argparse_utils").FlexibleArgumentParser

    class RaisingParser(base):  # type: ignore[misc,valid-type]
        def error(self, message: str) -> Any:
            raise _ParserError(message)

    for name in PARSER_MODULES:
        try:
            module = import_module(name)
        except ImportError:
            continue
        parser: argparse.ArgumentParser = module.make_arg_parser(RaisingParser())
        return parser
    raise ImportError(f"vLLM has none of {', '.join(PARSER_MODULES)}")


def one_line(text: object) -> str:
    """A multi-line message (pydantic's) as one line, without its documentation links."""
    lines = [ln.strip() for ln in str(text).splitlines()]
    return " ".join(ln for ln in lines if ln and not ln.startswith("For further information"))


def flag_errors(parser: argparse.ArgumentParser, args: Sequence[str]) -> list[tuple[str, str]]:
    """(flag, message) for every unknown or invalid flag in `args` (a model, then flags).

    Parsing stops at the first error, so each refused flag is reported, dropped, and the rest
    parsed again until what remains parses; then vLLM's post-parse checks run on it."""
    errors: list[tuple[str, str]] = []
    remaining = list(args)
    for _ in range(len(args) + 1):
        try:
            ns = parser.parse_args(remaining)
        except _ParserError as e:
            found = _named_in(str(e), parser)
        except Exception as e:  # a value vLLM's own type function refused without argparse
            found = _isolate(parser, remaining) or [("", f"{type(e).__name__}: {one_line(e)}")]
        else:
            return _in_order(errors, args, parser) + _post_parse(ns)
        errors += found
        shorter = _drop(remaining, [flag for flag, _ in found if flag], parser)
        if shorter == remaining:
            return _in_order(errors, args, parser)
        remaining = shorter
    return _in_order(errors, args, parser)


def _in_order(errors: list[tuple[str, str]], args: Sequence[str],
              parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """Errors in the order their flags appear on the command line (unnamed ones last)."""
    def where(error: tuple[str, str]) -> int:
        flag = error[0]
        hits = [i for i, t in enumerate(args) if flag and _is_flag(t) and flag in _names(parser, t)]
        return hits[0] if hits else len(args)

    return sorted(errors, key=where)


def _named_in(message: str, parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """The flags an argparse error names, each with its reason."""
    message = one_line(message)
    if message.startswith("unrecognized arguments:"):
        known = sorted(parser._option_string_actions)
        found = []
        for token in message.removeprefix("unrecognized arguments:").split():
            if not token.startswith("-"):
                continue
            flag = token.split("=", 1)[0]
            near = difflib.get_close_matches(flag, known, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            found.append((flag, f"not an option of vllm serve{hint}"))
        return found or [("", message)]
    if message.startswith("argument "):
        names, _, reason = message.removeprefix("argument ").partition(": ")
        flags = [n for n in names.split("/") if n.startswith("--")] or names.split("/")
        return [(max(flags, key=len), reason)]
    return [("", message)]


def _names(parser: argparse.ArgumentParser, token: str) -> set[str]:
    """Every spelling of the option that `token` gives (just the token's flag when unknown)."""
    flag = token.split("=", 1)[0]
    key = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
    action = parser._option_string_actions.get(key)
    return set(action.option_strings) | {flag} if action else {flag}


def _is_flag(token: str) -> bool:
    if not token.startswith("-"):
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False  # a negative number is a value


def _groups(parser: argparse.ArgumentParser, args: Sequence[str]) -> list[list[str]]:
    """`args` cut into [flag, values...] groups; a positional word is a group of its own."""
    groups: list[list[str]] = []
    for token in args:
        head = groups[-1] if groups else None
        if head is None or _is_flag(token) or not _is_flag(head[0]) or "=" in head[0]:
            groups.append([token])
            continue
        flag = head[0]
        key = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
        action = parser._option_string_actions.get(key)
        if action is None or action.nargs in ("+", "*", argparse.REMAINDER):
            head.append(token)  # an unknown flag takes the words after it
        elif action.nargs == 0 or (action.nargs in (None, 1, "?") and len(head) > 1):
            groups.append([token])
        else:
            head.append(token)
    return groups


def _drop(args: list[str], flags: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """`args` without the groups of these flags (under any of their spellings)."""
    if not flags:
        return args
    dropped = set(flags)
    kept = [g for g in _groups(parser, args) if not _names(parser, g[0]) & dropped]
    return [t for g in kept for t in g]


def _isolate(parser: argparse.ArgumentParser, args: Sequence[str]) -> list[tuple[str, str]]:
    """The first flag that fails when parsed alone (after the model), with the reason."""
    groups = _groups(parser, args)
    model = groups[0] if groups and not _is_flag(groups[0][0]) else []
    for group in groups:
        if group is model or not _is_flag(group[0]):
            continue
        try:
            parser.parse_args([*model, *group])
        except _ParserError as e:
            return _named_in(str(e), parser)
        except Exception as e:
            return [(group[0].split("=", 1)[0], f"{type(e).__name__}: {one_line(e)}")]
    return []


def _post_parse(ns: argparse.Namespace) -> list[tuple[str, str]]:
    """vLLM's quick checks on parsed serve arguments, where this vLLM has them."""
    for name in PARSER_MODULES:
        try:
            validate = import_module(name).validate_parsed_serve_args
        except (ImportError, AttributeError):
            continue
        try:
            validate(ns)
        except Exception as e:
            return [("", one_line(e).removeprefix("Error: "))]
        return []
    return []


def check_file(path: Path) -> dict[str, Any]:
    """The --check answer for a processes file."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    try:
        vllm = import_module("vllm")
        parser = build_parser()
    except Exception as e:
        return {"skipped": f"vLLM is not importable here ({type(e).__name__}: {one_line(e)}); "
                           "vLLM's own flag check skipped"}
    processes = []
    for p in doc["processes"]:
        errors = flag_errors(parser, p["argv"][2:])
        processes.append({"name": p["name"],
                          "errors": [{"flag": f, "message": m} for f, m in errors]})
    return {"vllm": getattr(vllm, "__version__", "unknown"), "processes": processes}


def main(argv: Sequence[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="vllm_args", description=__doc__.splitlines()[0])
    cli.add_argument("--check", required=True, type=Path, metavar="FILE",
                     help='JSON {"processes": [{"name", "argv"}]} to parse with vLLM')
    args = cli.parse_args(argv)
    result = check_file(args.check)
    sys.stdout.write(json.dumps(result) + "\n")
    if result.get("skipped"):
        return 0
    return 1 if any(p["errors"] for p in result["processes"]) else 0


if __name__ == "__main__":
    # Run by path, this folder is first on sys.path: drop it so that our module names
    # (cli, rules, render...) cannot shadow anything vLLM imports.
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)
    sys.exit(main())
