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


@pytest.mark.parametrize("text, needle", [
    ("aggregated: {dep: 8, instances: true}", "instances=true must be a number"),
    ("aggregated: {dep: 8, gpu_memory_utilization: .nan}", "=nan must be a finite number"),
])
def test_a_deployment_refuses_bools_and_nan_for_numbers(tmp_path, text, needle):
    from simulator.specs.loading import load_deployment

    path = tmp_path / "d.yaml"
    path.write_text(f"model: deepseek-v3\nhardware: h200\n{text}\n")
    with pytest.raises(SpecError, match=needle):
        load_deployment(path)


def test_a_workload_refuses_an_infinite_rate(tmp_path):
    from simulator.specs.loading import load_workload

    path = tmp_path / "w.yaml"
    path.write_text("arrival: {kind: poisson, rate: .inf}\n")
    with pytest.raises(SpecError, match=r"arrival\.rate=inf must be a finite number"):
        load_workload(path)
