"""Output paths checked before the work that fills them.

A command that writes a file or a folder at the end (a plan, a validation table, calibration
tables, a run folder) checks first that it could: the nearest existing folder on the way is a
folder this process can create files in (probed by creating and removing one), and the path is
not an existing thing of the other kind. Only then does the work start, so an hour of search or
calibration never ends on "permission denied"; the command still writes through a temporary
file and a rename, so a failure later leaves nothing half-written.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from simulator.specs.errors import SpecError


def writable(path: str | os.PathLike[str], what: str, folder: bool = False) -> Path:
    """`path` when a file (`folder`: a folder) can be written there, else SpecError naming the
    option `what` (e.g. "--out"), the path and why."""
    p = Path(path)
    if p.exists() and p.is_dir() != folder:
        kind = "a folder" if p.is_dir() else "a file"
        raise SpecError(f"{what} {str(p)!r} is {kind}; give the path of "
                        f"{'a folder' if folder else 'a file'} to write")
    parent = p if folder and p.exists() else p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise SpecError(f"{what} {str(p)!r}: {str(parent)!r} is not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".rackplan-probe-"):
            pass
    except OSError as e:
        raise SpecError(f"{what} {str(p)!r}: cannot write in {str(parent)!r} "
                        f"({e.strerror or e})") from None
    return p
