"""Golden manifests per flavor of the P/D wide-EP example plans, as `rackplan deploy --target
kubernetes --dry-run` writes them (every object, then the kustomization), each file checked
against its schema. Rewrite with RACKPLAN_UPDATE_GOLDEN=1 (tests/executor/golden_files.py)."""

import pytest
import yaml

from planner.cli import main
from tests.executor.cluster import ROOT
from tests.executor.golden_files import assert_golden
from tests.executor.schemas.validate import validate

CASES = [("deepseek-v4-flash-gb300-pd", "llm-d", "router"),
         ("deepseek-v4-flash-gb300-pd", "llm-d", "epp"),
         ("deepseek-v3-h200-pd", "llm-d", "router"),
         ("deepseek-v4-flash-gb300-pd", "dynamo", None),
         ("deepseek-v3-h200-pd", "dynamo", None),
         ("deepseek-v4-flash-gb300-pd", "kserve", None),
         ("deepseek-v3-h200-pd", "kserve", None)]


@pytest.mark.parametrize(("example", "flavor", "routing"), CASES)
def test_golden_manifests(tmp_path, capsys, example, flavor, routing):
    plan = ROOT / "examples" / f"{example}.yaml"
    routed = ["--routing", routing] if routing else []
    assert main(["deploy", str(plan), "--target", "kubernetes", "--flavor", flavor, *routed,
                 "--dry-run", "--out", str(tmp_path / "run")]) == 0
    paths = [tmp_path / "run" / "kubernetes" / line.rsplit("/", 1)[-1]
             for line in capsys.readouterr().out.splitlines()]
    assert paths[-1].name == "kustomization.yaml"
    for path in paths[:-1]:
        validate(yaml.safe_load(path.read_text()))
    text = "".join(f"# --- {p.name}\n{p.read_text()}" for p in paths)
    assert_golden(f"k8s-{flavor}{'-' + routing if routing else ''}-{example}.yaml", text)
