"""A disk cache of what the calibration derives from the measured tables (interpolation grids,
context edges, sustained rates), so a fresh process prices a step without pandas or parquet.

One `.npz` file per derived value, named by a digest of what it was derived with: the
calibration (hardware, engine, version, user folder), the operation's key and the row-selection
and roofline functions with every value they close over. Inside, next to the arrays, it records
its sources: each table file's path, size, mtime and inode, the package versions and a digest of
the calibration and spec code. A file whose sources differ (stale) or that cannot be read (corrupt,
truncated) is rebuilt from the tables and replaced. Writes go to a temporary file in the same
folder and are renamed into place, so concurrent processes never see half a file.

The folder is $RACKPLAN_CACHE_DIR, else $XDG_CACHE_HOME/rackplan/calibration, else
~/.cache/rackplan/calibration; `RACKPLAN_CACHE_DIR=off` turns the cache off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import types
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

CACHE_ENV = "RACKPLAN_CACHE_DIR"
"""Environment variable naming the cache folder; `off` turns the cache off."""
OFF = "off"
FORMAT = 1
"""Bumped when the layout of a cache file changes."""
_PACKAGES = ("rackplan", "numpy", "pandas", "pyarrow", "aiconfigurator-core")
_CODE = ("simulator/calibration", "simulator/specs")
"""Folders whose Python sources a derived value's arithmetic runs in."""


def cache_dir() -> Path | None:
    """The cache folder (not created here); None when the cache is off."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        return None if chosen.strip().lower() == OFF else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rackplan" / "calibration"


class Uncacheable(Exception):
    """A value in a derived value's recipe that has no stable description (an object whose
    repr is its address): the value is built without the cache."""


def describe(obj: Any) -> str:
    """A description of `obj` that is equal across processes exactly when the value is:
    functions by name, line and everything they close over, arrays by their bytes."""
    if obj is None or isinstance(obj, bool | int | float | str | bytes):
        return repr(obj)
    if isinstance(obj, tuple | list):
        return f"{type(obj).__name__}({', '.join(describe(x) for x in obj)})"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{describe(k)}: {describe(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, np.ndarray):
        digest = hashlib.sha256(np.ascontiguousarray(obj).tobytes()).hexdigest()
        return f"ndarray({obj.dtype.str}, {obj.shape}, {digest})"
    if isinstance(obj, np.generic):
        return f"{obj.dtype.str}:{obj!r}"
    if isinstance(obj, types.FunctionType):
        cells = [c.cell_contents for c in obj.__closure__ or ()]
        return (f"fn {obj.__module__}.{obj.__qualname__}:{obj.__code__.co_firstlineno}"
                f"(closure={describe(cells)}, defaults={describe(obj.__defaults__)}, "
                f"kwdefaults={describe(obj.__kwdefaults__)})")
    if isinstance(obj, types.MethodType):
        return f"method {describe(obj.__func__)} of {describe(obj.__self__)}"
    if isinstance(obj, types.BuiltinFunctionType | types.ModuleType):
        return f"{type(obj).__name__} {getattr(obj, '__module__', '')}.{obj.__name__}"
    name = f"{type(obj).__module__}.{type(obj).__qualname__}"
    text = repr(obj)
    if " at 0x" not in text and " object>" not in text:
        return f"{name}:{text}"
    if hasattr(obj, "__dict__") and not hasattr(type(obj), "__slots__"):
        return f"{name} with {describe(vars(obj))}"  # e.g. a stateless attention kind
    raise Uncacheable(f"{name} has no stable description")


def code_digest(packages: Iterable[str], files: Iterable[Path], root: Path) -> str:
    """A digest of the installed versions of `packages` and of each of `files` (its path
    under `root` and its bytes), in the order given."""
    h = hashlib.sha256()
    for pkg in packages:
        try:
            h.update(f"{pkg}={metadata.version(pkg)};".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{pkg}=none;".encode())
    for path in files:
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.cache
def _code_digest() -> str:
    """Package versions and a digest of the calibration and spec sources."""
    root = Path(__file__).resolve().parents[2]
    return code_digest(_PACKAGES, [p for folder in _CODE
                                   for p in sorted((root / folder).glob("*.py"))], root)


def _sources(files: Iterable[Path]) -> str:
    """JSON of each file's path, size, mtime, ctime and inode (None for a file that is gone),
    plus the code: a table rewritten in place or replaced by a rename shows in one of them."""
    stats: list[Any] = [FORMAT, _code_digest()]
    for f in sorted(set(files)):
        try:
            st = f.stat()
            stats.append([str(f), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
        except OSError:
            stats.append([str(f), None])
    return json.dumps(stats)


def _read(path: Path, sources: str) -> dict[str, np.ndarray] | None:
    """The arrays of a cache file written from `sources`; None when missing, stale or corrupt."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            if str(npz["_sources"]) != sources:
                return None
            return {k: npz[k] for k in npz.files if k != "_sources"}
    except Exception:  # missing, truncated, not a zip, wrong keys: rebuild it
        return None


def _write(path: Path, sources: str, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically (temporary file + rename); a folder we cannot write is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
        try:
            payload: dict[str, Any] = {"_sources": np.array(sources), **arrays}
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **payload)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


def cached(recipe: tuple[Any, ...], files: Iterable[Path],
           build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`build()`'s arrays, from the cache when a file for `recipe` holds them and `files` are
    unchanged since it was written; else built, stored and returned."""
    folder = cache_dir()
    if folder is None:
        return build()
    try:
        name = hashlib.sha256(describe(recipe).encode()).hexdigest()[:32]
    except Uncacheable:
        return build()
    path = folder / f"{name}.npz"
    sources = _sources(files)
    got = _read(path, sources)
    if got is None:
        got = build()
        _write(path, sources, got)
    return got
