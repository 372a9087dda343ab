"""Launch targets for a rendered deployment, one table of choices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from executor.backends.base import Backend, LaunchError
from executor.lazy import lazy_class
from executor.records import Rendered

BACKENDS: dict[str, str] = {
    "local": "executor.backends.local:LocalBackend",
    "kubernetes": "executor.backends.kubernetes:KubernetesBackend",
    "slurm": "executor.backends.slurm:SlurmBackend",
}
"""`--target` name -> the class that implements it (imported when chosen)."""


def backend_class(target: str) -> type[Backend]:
    """The class of `target` (SpecError naming the valid targets when there is none)."""
    backend: type[Backend] = lazy_class(BACKENDS, target, "target")
    return backend


def get_backend(target: str, rendered: Rendered, run_dir: Path, **options: str) -> Backend:
    """The backend for `target`, bound to a rendered deployment and its run directory, with
    the target's own options (the kubernetes target's flavor, name, images...)."""
    cls: Any = backend_class(target)  # a target that takes options lists them
    backend: Backend = cls(rendered, run_dir, **options)
    return backend


__all__ = ["BACKENDS", "Backend", "LaunchError", "backend_class", "get_backend"]
