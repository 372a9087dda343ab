"""A backend that launches nothing and records what it was asked: the test double.

`MockBackend(rendered, run_dir)` answers every call of the Backend interface at once and
appends its name to `calls` (`wait_ready` with its timeout); `fail` names one step ("launch",
"wait_ready") that raises LaunchError instead, so a caller's teardown-on-failure shows in the
calls. `url` is what it reports as the router; `foreground` stands for a target that serves
until Ctrl-C; `stop_with` is the signal its `supervise` sends this very process (a user's Ctrl-C
or SIGTERM). It writes no file: `render` returns no paths and `dry_run_lines` the processes'
command lines.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from executor.backends.base import Backend, LaunchError
from executor.records import Rendered

STEPS = ("launch", "wait_ready", "supervise")
"""The steps `fail` may name."""


class MockBackend(Backend):
    """Every call recorded, nothing started."""

    name: ClassVar[str] = "mock"

    def __init__(self, rendered: Rendered, run_dir: Path, *, url: str = "http://127.0.0.1:8099",
                 foreground: bool = False, fail: str | None = None,
                 stop_with: int | None = None) -> None:
        super().__init__(rendered, run_dir)
        if fail is not None and fail not in STEPS:
            raise ValueError(f"fail={fail!r}; valid: {', '.join(STEPS)}")
        self.calls: list[str] = []
        """Each call made, in order: render, launch, wait_ready <timeout>, teardown."""
        self.foreground = foreground
        self.fail = fail
        self.stop_with = stop_with
        """A signal `supervise` sends this process, as a user stopping the deployment would."""
        self._url = url

    @property
    def url(self) -> str:
        return self._url

    def _step(self, call: str, step: str) -> None:
        self.calls.append(call)
        if self.fail == step:
            raise LaunchError(f"{step} failed (mock)")

    def render(self) -> list[Path]:
        self.calls.append("render")
        return []

    def dry_run_lines(self) -> list[str]:
        self.calls.append("dry_run_lines")
        return [p.command_line() for p in self.rendered.processes]

    def launch(self) -> None:
        self._step("launch", "launch")

    def wait_ready(self, timeout_s: float) -> None:
        self._step(f"wait_ready {timeout_s:g}", "wait_ready")

    def supervise(self, restarts: int = 0, ready_timeout_s: float = 600.0,
                  say: Callable[[str], object] | None = None) -> None:
        self._step(f"supervise {restarts}", "supervise")
        if self.stop_with is not None:
            os.kill(os.getpid(), self.stop_with)
            time.sleep(5.0)  # the signal's handler raises before this ends
        raise AssertionError("supervise returned without a stop signal (give stop_with)")

    def teardown(self) -> None:
        self.calls.append("teardown")
