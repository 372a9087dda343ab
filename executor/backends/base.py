"""The one interface every launch target implements.

A backend takes a `Rendered` deployment (the launch records and the router) and a run directory.
`render` writes the target's files (command lines, manifests, batch scripts) and starts nothing.
`launch` starts the deployment; `wait_ready` returns once every instance answers a real request;
`teardown` stops everything it started and is safe to call twice, after a failed launch, or from
a signal handler. A foreground target's `supervise` watches the ready deployment until the caller
is stopped by a signal, and raises LaunchError naming what died (after the restarts it may make).
What `rackplan deploy` asks besides is each target's own answer, so the CLI
never branches on a target's name: `render_for` (the rendering it launches), `preflight` (what
it refuses before anything is built), `dry_run_lines` (what `--dry-run` prints) and `foreground`
(whether deploy keeps serving until Ctrl-C). executor/backends/mock.py is the test double.
"""

from __future__ import annotations

import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from executor.records import Rendered
from executor.render import render as render_deployment
from simulator.specs.deployment import Deployment


class LaunchError(RuntimeError):
    """A launch or readiness failure, phrased for people: which instance failed and why (for a
    local process, with the tail of its log)."""


class Backend(ABC):
    """Where a rendered deployment runs."""

    name: ClassVar[str]
    """The `--target` value that selects this backend."""
    render_options: ClassVar[tuple[str, ...]] = ()
    """Deploy flags (of executor/cli.py's TARGET_FLAGS) that `render_for` takes."""
    foreground: bool = False
    """Whether `rackplan deploy` keeps serving in the foreground once ready and tears the
    deployment down on Ctrl-C (else it leaves it running on the target and returns)."""

    def __init__(self, rendered: Rendered, run_dir: Path) -> None:
        self.rendered = rendered
        self.run_dir = Path(run_dir)

    @property
    def router_port(self) -> int:
        """The port our P/D proxy (the router) listens on."""
        port = self.rendered.router["port"]
        assert isinstance(port, int)
        return port

    @property
    def url(self) -> str | None:
        """Where clients reach the deployment (the router), once it is known."""
        return None

    @classmethod
    def render_for(cls, deployment: Deployment, model: str, **options: Any) -> Rendered:
        """The rendering this target launches, serving `model` (by default each host keeps
        its placeholder name, host0, host1, ..., which the target's scheduler fills in);
        `options`: the `render_options` given."""
        return render_deployment(deployment, model)

    @classmethod
    def preflight(cls, deployment: Deployment) -> None:
        """Raise LaunchError, before anything is built or started, for a deployment this target
        cannot launch (by default every one can be tried)."""
        return None

    def dry_run_lines(self) -> list[str]:
        """What `--dry-run` prints, starting nothing: by default the target's files, written,
        one path a line."""
        return [str(path) for path in self.render()]

    @abstractmethod
    def render(self) -> list[Path]:
        """Write the target's files under run_dir and return their paths; start nothing."""

    @abstractmethod
    def launch(self) -> None:
        """Start every process of the deployment and the router."""

    @abstractmethod
    def wait_ready(self, timeout_s: float) -> None:
        """Block until every instance has answered a completion; raise LaunchError naming the
        instance that did not, within `timeout_s` seconds."""

    def supervise(self, restarts: int = 0, ready_timeout_s: float = 600.0,
                  say: Callable[[str], object] | None = None) -> None:
        """Serve until the caller is stopped (a signal raises in it); raise LaunchError when
        part of the deployment died and `restarts` restarts did not bring it back. By default a
        target has nothing to watch from here and only serves (a cluster's scheduler restarts
        its own pods)."""
        while True:
            time.sleep(1.0)

    @abstractmethod
    def teardown(self) -> None:
        """Stop everything launch started; idempotent."""


def write_atomic(path: Path, text: str, mode: int = 0o644) -> Path:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
