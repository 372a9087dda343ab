"""Dockerfile.router and `make router-image`: the image installs rackplan from the files it
copies, its entrypoint runs our router, and the tag `make` builds is the one the manifests use.
(Building the image itself needs a Docker daemon; this checks everything short of it.)"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile

import pytest

from executor.backends.k8s_pod import ROUTER_IMAGE
from tests.executor.cluster import ROOT

DOCKERFILE = ROOT / "Dockerfile.router"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of each line of the Dockerfile, comments left out."""
    out = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def copied() -> list[str]:
    return [src for word, rest in instructions() if word == "COPY"
            for src in rest.split()[:-1]]


def test_the_entrypoint_runs_our_router_with_the_manifests_config():
    steps = dict(instructions())
    assert steps["FROM"].startswith("python:3.11")
    assert json.loads(steps["ENTRYPOINT"]) == ["python", "-m", "executor.proxy"]
    assert json.loads(steps["CMD"]) == ["--config", "/etc/rackplan/router.json"]
    assert any(word == "RUN" and re.search(r"pip install .*\.( |$)", rest)
               for word, rest in instructions())
    help_text = subprocess.run([sys.executable, "-m", "executor.proxy", "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "--config" in help_text


def test_make_router_image_builds_the_tag_the_manifests_run():
    if shutil.which("make") is None:
        pytest.skip("no make")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    make = ["make", "--no-print-directory", "-n"]  # also when the suite runs under make test
    out = subprocess.run([*make, "router-image"], cwd=ROOT, capture_output=True, text=True,
                         check=True, env=env).stdout.strip()
    assert shlex.split(out) == ["docker", "build", "-f", "Dockerfile.router", "-t",
                                ROUTER_IMAGE, "."]
    out = subprocess.run([*make, "router-image", "ROUTER_IMAGE=reg.example/r:2"], cwd=ROOT,
                         capture_output=True, text=True, check=True, env=env).stdout
    assert "-t reg.example/r:2" in out


def test_the_copied_files_build_a_package_with_the_router_and_what_it_imports(tmp_path):
    """A wheel built from exactly what the Dockerfile copies holds the proxy and the routing
    policies it imports (what `pip install .` in the image installs)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in copied():
        path = ROOT / name.rstrip("/")
        if path.is_dir():
            shutil.copytree(path, src / path.name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, src / path.name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, text=True)
    (wheel,) = (tmp_path / "dist").glob("rackplan-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("executor/proxy.py", "executor/prefix_index.py",
                   "simulator/specs/routing.py"):
        assert needed in names
