"""Shared by the local backend's tests: free ports, tiny CPU deployments, the fake engine."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from executor.backends.local import LocalBackend, free_base_port, render_local
from executor.records import Rendered
from simulator.specs.deployment import Deployment
from simulator.specs.loading import load_deployment

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples"
TINY_PD = EXAMPLES / "tiny-moe-cpu-pd.yaml"
"""1 prefill + 1 decode instance of tiny-moe on the cpu hardware (a plan.yaml)."""
TINY_AGG = EXAMPLES / "tiny-moe-cpu-agg.yaml"
"""One aggregated tiny-moe instance on the cpu hardware (a plan.yaml)."""


def plan_deployment(path: Path) -> Deployment:
    """The deployment of a tiny-moe plan.yaml in examples/."""
    import yaml

    return load_deployment(yaml.safe_load(path.read_text())["deployment"])


def local_rendering(deployment: Deployment, model: str) -> Rendered:
    """The deployment rendered on free local ports."""
    n = sum(r.instances for r in deployment.roles.values())
    return render_local(deployment, model, base_port=free_base_port(n))


def serve(deployment: Deployment, model: str, run_dir: Path,
          ready_timeout_s: float) -> Iterator[LocalBackend]:
    """The deployment launched on the real engine and ready, torn down after use (a fixture's
    body: yield from it)."""
    backend = LocalBackend(local_rendering(deployment, model), run_dir)
    try:
        backend.launch()
        backend.wait_ready(ready_timeout_s)
        yield backend
    finally:
        backend.teardown()


def fake_vllm(tmp: Path) -> Path:
    """An executable that runs tests/executor/fake_vllm.py with this interpreter."""
    exe = tmp / "fake-vllm"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "fake_vllm.py"}" "$@"\n')
    exe.chmod(0o755)
    return exe


def engine_venv(tmp: Path) -> Path:
    """An engine environment (what $RACKPLAN_ENGINE_VENV names) whose `vllm` is the fake."""
    venv = tmp / "engine"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").symlink_to(fake_vllm(tmp))
    return venv


def with_flag(rendered: Rendered, instance: str, flag: str) -> Rendered:
    """The rendering with one extra switch for every process of one instance."""
    procs = tuple(p if p.instance != instance else replace(p, flags=(*p.flags, (flag, None)))
                  for p in rendered.processes)
    return Rendered(procs, rendered.router)


def assert_nothing_left(backend: LocalBackend) -> None:
    """Every recorded process group is gone (no live member)."""
    assert backend.launched, "nothing was launched"
    left = backend.alive()
    assert not left, f"still running after teardown: {left}"
