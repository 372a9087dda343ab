"""Helpers for the cluster backends' tests: renderings to launch, and fake cluster tools."""

import os
import stat
import textwrap
from pathlib import Path

from executor.records import Rendered
from executor.render import render
from simulator.specs.deployment import Deployment, RoleSpec
from simulator.specs.loading import load_deployment

ROOT = Path(__file__).resolve().parents[2]
MODEL = "/models/DeepSeek-V3"
V3 = ROOT / "examples" / "deepseek-v3-h200-pd.yaml"
V4 = ROOT / "examples" / "deepseek-v4-flash-gb300-pd.yaml"


def pd_rendering() -> Rendered:
    """The golden P/D example: 4 x DEP8 prefill (one host each) + 1 x DEP40 decode (5 hosts)."""
    return render(load_deployment(V3), model_path=MODEL)


def uneven_rendering() -> Rendered:
    """2 x DEP20 on 8-GPU hosts: hosts of 8, 8 and 4 ranks (routed 256 + 4 = 260 = 20 x 13)."""
    d = Deployment(model="deepseek-v3", hardware="h200",
                   aggregated=RoleSpec(instances=2, dep=20, redundant_experts=4))
    return render(d, model_path=MODEL)


def k8s_v3() -> Rendered:
    """The golden P/D example on H200 (InfiniBand) as the Kubernetes backend renders it,
    serving a folder on the model volume."""
    from executor.backends.kubernetes import KubernetesBackend

    return KubernetesBackend.render_for(load_deployment(V3), MODEL)


def k8s_v4() -> Rendered:
    """The DeepSeek-V4 P/D example on GB300 as the Kubernetes backend renders it, serving the
    model's own id."""
    from executor.backends.kubernetes import KubernetesBackend

    d = load_deployment(V4)
    return KubernetesBackend.render_for(d, d.model)


def flavor_objects(tmp_path: Path, flavor: str, rendered: Rendered | None = None,
                   **options: str) -> list[dict]:
    """The objects a Kubernetes flavor writes for `rendered` (default `k8s_v3`), in file order,
    without the kustomization."""
    import yaml

    from executor.backends.kubernetes import KubernetesBackend

    backend = KubernetesBackend(rendered or k8s_v3(), tmp_path / "deploy-dsv3", flavor=flavor,
                                **options)
    return [yaml.safe_load(f.read_text()) for f in backend.render()[:-1]]


def fake_tool(bin_dir: Path, name: str, body: str) -> Path:
    """An executable bash script `name` in `bin_dir` that appends its arguments, one call per
    line, to $FAKE_LOG and then runs `body`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/bash\n"
                    f'echo "{name} $*" >> "$FAKE_LOG"\n'
                    + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def use_path(monkeypatch, *dirs: Path, system: bool = True) -> None:
    """PATH = these folders (then /usr/bin:/bin when `system`)."""
    parts = [str(d) for d in dirs] + (["/usr/bin", "/bin"] if system else [])
    monkeypatch.setenv("PATH", os.pathsep.join(parts))


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []
