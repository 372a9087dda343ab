"""Output paths are checked before the work: a folder that cannot be written, a file where a
folder is wanted and the reverse, each one line naming the option and the path."""

import os

import pytest

from simulator.specs.errors import SpecError
from simulator.specs.paths import writable


def test_a_new_file_under_missing_folders_is_fine(tmp_path):
    assert writable(tmp_path / "a" / "b" / "plan.yaml", "--out") == tmp_path / "a/b/plan.yaml"
    assert not (tmp_path / "a").exists()  # nothing created by the check
    assert [p.name for p in tmp_path.iterdir()] == []


def test_the_wrong_kind_of_thing_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SpecError, match=r"--out '.*f' is a file; give the path of a folder"):
        writable(tmp_path / "f", "--out", folder=True)
    with pytest.raises(SpecError, match=r"--out '.*' is a folder; give the path of a file"):
        writable(tmp_path, "--out")
    with pytest.raises(SpecError, match=r"is not a folder"):
        writable(tmp_path / "f" / "plan.yaml", "--out")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere chmod allows")
def test_a_read_only_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(SpecError, match=r"cannot write in"):
            writable(ro / "plan.yaml", "--out")
    finally:
        ro.chmod(0o700)


def test_a_pseudo_filesystem_is_refused():
    with pytest.raises(SpecError, match=r"--out '/proc/x': cannot write in '/proc'"):
        writable("/proc/x", "--out", folder=True)
