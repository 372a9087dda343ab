"""Writing measured rows as calibration tables, in the layout the calibration layer reads.

<out>/<folder>/<engine>/<version>/<file>.parquet, the same folders, files and columns as the
aiconfigurator-core tables (simulator.calibration.tables.OP_FILES), plus manifest.json. The
whole folder is written next to its destination and renamed into place, so a reader sees the
old calibration or the new one, never half of one.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.calibration.tables import OP_ENGINES, OP_FILES
from simulator.specs.errors import SpecError

EXTRA_FILES = {"memory": ("memory", "mem_copy_perf.parquet")}
"""Tables the calibration layer does not read (yet), kept in the same layout."""
MANIFEST = "manifest.json"


def table_path(op: str, engine: str, version: str) -> Path:
    """Where the table of a calibration-layer op (or an extra table) lives, relative."""
    folder, fname = OP_FILES[op] if op in OP_FILES else EXTRA_FILES[op]
    engine_dir = OP_ENGINES[op][0] if op in OP_ENGINES else engine
    return Path(folder) / engine_dir / version / fname


def check_destination(out: Path) -> None:
    """SpecError unless `out` is absent, an empty folder or an earlier calibration."""
    if out.exists() and not out.is_dir():
        raise SpecError(f"--out {out} is a file; give a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise SpecError(f"--out {out} is a non-empty folder without {MANIFEST}; give a new or "
                        "empty folder, or an earlier calibration to replace")


def write_calibration(out: str | Path, tables: dict[str, list[dict[str, Any]]],
                      manifest: dict[str, Any], engine: str, version: str) -> dict[str, str]:
    """Write each op's rows and the manifest under `out`, atomically; returns op -> file.

    An existing `out` must be empty or an earlier calibration (it is replaced)."""
    out = Path(out)
    check_destination(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        files: dict[str, str] = {}
        for op, rows in tables.items():
            if not rows:
                continue
            rel = table_path(op, engine, version)
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(rows).to_parquet(tmp / rel, index=False)
            files[op] = rel.as_posix()
        manifest = {**manifest, "tables": files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files


def _replace(new: Path, out: Path) -> None:
    """Rename `new` to `out`; an old `out` is moved aside first and removed after."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        old.rmdir()
        out.rename(old)
    try:
        new.rename(out)
    except BaseException:
        if old is not None:
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(out: str | Path) -> dict[str, Any]:
    """The manifest of a calibration folder."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise SpecError(f"{out} holds no {MANIFEST}; run `rackplan calibrate --out {out}`")
    data: dict[str, Any] = json.loads(path.read_text())
    return data
