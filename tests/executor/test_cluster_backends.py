"""What every cluster backend (kubernetes, slurm) promises, one suite run against each:
render writes its files under the run directory and starts nothing; without the cluster's tool
launch says to use --dry-run; teardown before or after launch is safe to repeat."""

from pathlib import Path

import pytest

from executor.backends import get_backend
from executor.backends.base import LaunchError
from tests.executor.cluster import calls, fake_tool, pd_rendering, use_path

CASES = [("kubernetes", "kubectl", "manifests", "kubernetes"),
         ("slurm", "sbatch", "batch scripts", "slurm")]


@pytest.mark.parametrize(("target", "tool", "what", "folder"), CASES)
def test_render_writes_under_the_run_directory_and_starts_nothing(tmp_path, monkeypatch, target,
                                                                  tool, what, folder):
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    for name in ("kubectl", "sbatch", "srun", "scancel", "squeue"):
        fake_tool(tmp_path / "bin", name, "exit 0\n")
    use_path(monkeypatch, tmp_path / "bin")
    backend = get_backend(target, pd_rendering(), tmp_path / "run")
    files = backend.render()
    assert files and all(f.is_file() for f in files)
    assert all(f.parent == tmp_path / "run" / folder for f in files)
    assert len(set(files)) == len(files)
    assert calls(log) == []
    backend.teardown()
    assert calls(log) == []  # nothing launched: nothing to stop


@pytest.mark.parametrize(("target", "tool", "what", "folder"), CASES)
def test_launch_without_the_cluster_tool_says_to_use_dry_run(tmp_path, monkeypatch, target,
                                                             tool, what, folder):
    use_path(monkeypatch, tmp_path / "empty", system=False)
    backend = get_backend(target, pd_rendering(), tmp_path / "run")
    with pytest.raises(LaunchError) as e:
        backend.launch()
    assert str(e.value) == (f"{tool} not found on PATH; use --dry-run to write the {what} to "
                            f"{Path(tmp_path / 'run' / folder)}")
    backend.teardown()
    backend.teardown()
