"""Reading spec files: a YAML bomb is refused before it is expanded."""

import pytest

from simulator.specs.errors import SpecError


def test_a_file_that_aliases_into_billions_is_refused_at_once(tmp_path):
    from simulator.specs.loading import MAX_YAML_NODES, read_yaml

    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")  # 9**9 in the end
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecError, match=f"more than {MAX_YAML_NODES:,} YAML nodes"):
        read_yaml(path)
    shared = tmp_path / "shared.yaml"
    shared.write_text("base: &b {dep: 8}\nprefill: *b\ndecode: *b\n")
    assert read_yaml(shared)["decode"] == {"dep": 8}  # ordinary anchors still load
