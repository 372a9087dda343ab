"""Write the README's screenshots of the UI: `python -m app.screenshots [--out DIR]`.

Starts `rackplan ui` in a scratch folder (its search study stays there), runs a what-if
simulation, a small search and the deploy page in headless Chromium, and saves one PNG per view
(default docs/screenshots/). Needs the ui extra and the system's Chromium.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from app.browser import CHROMIUM_VAR, chromium, serve, tour

DEFAULT_OUT = Path("docs") / "screenshots"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.screenshots", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"folder for the PNG files (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    executable = chromium()
    if executable is None:
        print(f"screenshots: no Chromium found; install it (apt-get install chromium) or set "
              f"{CHROMIUM_VAR}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rackplan-ui-") as scratch, \
            serve(Path(scratch)) as url:
        seen = tour(url, executable, out)
    for path in seen.screenshots.values():
        print(path)
    print(f"{len(seen.screenshots)} screenshots in {time.monotonic() - start:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
