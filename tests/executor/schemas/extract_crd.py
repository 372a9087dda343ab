"""Write a CRD's openAPIV3Schema as JSON, its `description` texts left out (the schema itself,
every type, enum, bound, pattern and required list, is kept as the CRD gives it).

    python tests/executor/schemas/extract_crd.py CRD.yaml VERSION OUT.json

README.md in this folder lists where each file here was copied from."""

import json
import sys
from pathlib import Path

import yaml


def strip(node: object) -> object:
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items()
                if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main(crd_path: str, version: str, out: str) -> None:
    crd = yaml.safe_load(Path(crd_path).read_text())
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = strip(entry["schema"]["openAPIV3Schema"])
    Path(out).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
