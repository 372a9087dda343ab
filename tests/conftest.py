"""The suite runs as a terminal's foreground job would, whoever starts it, and on two workers
without two deployments at once.

A job started in the background by a non-interactive shell (`make test &`, a CI runner's
`nohup`) inherits SIGINT and SIGHUP ignored, and so would every process the tests start: the
commands under test rightly keep an inherited ignored signal ignored, so the tests of Ctrl-C and
hangup would see nothing happen. Here both get their default action back before any test runs
(a Python handler for SIGINT, which exec resets to the default in the processes started); the
test of an inherited ignored SIGINT sets it ignored in its own child.

`make test` runs pytest-xdist's `--dist loadfile` on two workers; the scheduler below also keeps
the files that start real engines together (see ENGINE_FILES).
"""

import signal
from typing import Any

import pytest

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


# ---- two workers (`make test` runs pytest -n 2 --dist loadfile) --------------------------------

ENGINE_FILES = ("tests/executor/test_engine_", "tests/benchmarks/test_closed_loop.py")
"""Files whose tests start real engines (two vLLM CPU processes each, both cores busy): one
worker runs all of them, one after another, so that no two deployments share the machine."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with every file of ENGINE_FILES in one unit: a file's tests run on one
    worker (module and class fixtures, such as a started deployment or the reliability cases'
    run, are built once), and the files that start engines on the same worker."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Files(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "engine" if path.startswith(ENGINE_FILES) else path

        def _assign_work_unit(self, node: Any) -> None:
            # the engine files first: the longest unit (about 12 minutes), which would
            # otherwise run last (units go out by their number of tests) and alone
            if "engine" in self.workqueue:
                self.workqueue.move_to_end("engine", last=False)
            super()._assign_work_unit(node)

    return Files(config, log)
