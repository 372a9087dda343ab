"""The watchdog of a local deployment: it ends the deployment when the deploying process dies.

`python -m executor.watchdog RUN_DIR GRACE_S` runs in its own session with the read end of a
pipe as its standard input; only the deploying process holds the write end. When that process
exits, however it exits (SIGKILL included), the kernel closes the write end, the watchdog reads
end-of-file and ends whatever of the run is left (executor/backends/runs.py `stop_run`: SIGTERM,
then SIGKILL after GRACE_S, and the KV folder removed), writing what it did to
RUN_DIR/logs/watchdog.log. After an orderly teardown it finds nothing left and just exits.
It ignores SIGINT and SIGHUP: a Ctrl-C or a closed terminal reaches the deploying process, which
tears down itself; the watchdog only covers the case where it cannot.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from executor.backends.base import LaunchError
from executor.backends.runs import stop_run


def main(argv: list[str]) -> int:
    run_dir, grace_s = Path(argv[0]), float(argv[1])
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):  # blocks until the deploying process is gone
        pass
    log = run_dir / "logs" / "watchdog.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as out:
        def say(line: str) -> None:
            out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
            out.flush()
        try:
            ended = stop_run(run_dir, grace_s, say, ask_owner=False)
        except LaunchError as e:
            say(f"error: {e}")
            return 1
        say(f"the deploying process is gone; ended {ended} process group(s) it left")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
