"""The loaders raise nothing but SpecError: config.json, deployment and workload YAML, a trace
and plan.yaml, each mutated from real valid inputs (keys dropped or renamed, values replaced by
wrong types, negatives, zero, NaN, infinity, huge integers, nested junk) and as raw junk text,
either load or are refused with one SpecError sentence.

Hypothesis runs derandomized (a fixed seed) with a fixed example budget, so CI sees the same
inputs every run; the plain tests below it pin each bug the fuzzing found.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.plan import load_plan_or_deployment
from simulator.des.traces import read_trace
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_deployment, load_workload
from simulator.specs.model import (
    BUILDERS,
    PRESET_DIR,
    ModelSpec,
    load_model,
    model_from_config,
    preset_names,
)

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "data" / "mooncake_conversation_50.jsonl"


def fuzz(examples: int) -> Any:
    """Hypothesis settings for CI: a fixed seed, `examples` inputs, no per-example deadline
    (a loaded CI machine is slow), no example database written."""
    return settings(derandomize=True, max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- real valid inputs ------------------------------------------------------------------------

def _preset(name: str) -> dict[str, Any]:
    text = resources.files("simulator.specs").joinpath(f"{PRESET_DIR}/{name}.json").read_text()
    return json.loads(text)


def _shipped_configs() -> list[dict[str, Any]]:
    """aiconfigurator-core's config.json files of architectures we build ([] if absent)."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "model_configs"
    cfgs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return [c for c in cfgs if (c.get("architectures") or [None])[0] in BUILDERS]


CONFIGS = [_preset(n) for n in preset_names()] + _shipped_configs()
DEPLOYMENTS = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "examples").glob("*.yaml"))
               if "model" in yaml.safe_load(p.read_text())]
WORKLOADS = [yaml.safe_load(p.read_text()) for p in
             [ROOT / "examples" / "workload-chat.yaml",
              *sorted((ROOT / "planner" / "presets").glob("*.yaml"))]]
TRACE_ROWS = [json.loads(line) for line in TRACE.read_text().splitlines()[:6]]
SESSION_ROWS = [{"timestamp": 0, "input_length": 1024, "output_length": 512, "session_id": "a"},
                {"timestamp": 10, "input_length": 300, "output_length": 20, "session_id": "b"},
                {"timestamp": 2000, "input_length": 2048, "output_length": 100,
                 "session_id": "a"}]


# ---- strategies -------------------------------------------------------------------------------

SPECIAL = st.sampled_from([None, True, False, 0, -1, 1.5, -0.5, math.nan, math.inf, -math.inf,
                           10**40, -(10**40), 2**63, "", "12", "abc", [], {}, [[]], {"kind": 1}])
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6)
"""Any JSON-ish value, scalars to small nested lists and objects."""


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key and list index in a document, as the path of keys that reaches it."""
    out: list[tuple[Any, ...]] = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) \
        else ()
    for key, value in items:
        out.append((*at, key))
        out.extend(_paths(value, (*at, key)))
    return out


def _near(value: Any) -> list[Any]:
    """Numbers close to a valid one that often break a rule: zero, its negation, far too big,
    off by one, the same as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return []
    return [0, -value, value * 10**9, value + 1, value - 1, float(value), value / 3]


@st.composite
def mutated(draw: st.DrawFn, docs: list[Any]) -> Any:
    """One of `docs`, changed in one to three places: a key dropped or renamed, or a value
    replaced by a nearby number, a special value or nested junk."""
    doc = copy.deepcopy(draw(st.sampled_from(docs)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        op = draw(st.sampled_from(["drop", "rename", "near", "special", "junk"]))
        if op == "drop" and isinstance(parent, dict):
            del parent[key]
        elif op == "rename" and isinstance(parent, dict):
            parent[f"{key}_"] = parent.pop(key)
        elif op == "near" and _near(parent[key]):
            parent[key] = draw(st.sampled_from(_near(parent[key])))
        else:
            parent[key] = copy.deepcopy(draw(SPECIAL if op == "special" else JUNK))
    return doc


def refused_or_loaded(load: Any, *args: Any) -> Any:
    """load(*args), or None when it refuses the input with a SpecError (any other exception
    fails the test)."""
    try:
        return load(*args)
    except SpecError as e:
        assert str(e) and "\n" not in str(e).strip(), f"not one sentence: {e}"
        return None


_names = itertools.count()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the module's files (hypothesis reruns a test many times in one call)."""
    return tmp_path_factory.mktemp("fuzz")


def _file(folder: Path, suffix: str, text: str | bytes) -> Path:
    """A new file each call (load_model caches by path)."""
    path = folder / f"f{next(_names)}{suffix}"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# ---- config.json ------------------------------------------------------------------------------

def _priced(m: ModelSpec) -> None:
    """What the cost model asks of a spec works on whatever loads."""
    assert m.total_params() >= m.active_params() > 0
    m.weight_bytes("fp8")
    m.kv_bytes_per_token("fp8")
    m.kv_bytes(5000.0, "bf16")
    m.flops_per_token(1000.0)


def test_every_real_config_still_loads() -> None:
    for cfg in CONFIGS:
        _priced(model_from_config("real", cfg))


@fuzz(600)
@given(mutated(CONFIGS))
def test_a_mutated_config_json_loads_or_raises_spec_error(cfg: Any) -> None:
    m = refused_or_loaded(model_from_config, "fuzz", cfg)
    if m is not None:
        _priced(m)


@fuzz(100)
@given(st.one_of(JUNK, st.dictionaries(st.sampled_from(["architectures", "text_config",
                                                         "hidden_size"]), JUNK)))
def test_junk_json_as_a_config_raises_spec_error(cfg: Any) -> None:
    refused_or_loaded(model_from_config, "junk", cfg)


@fuzz(60)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_a_junk_config_file_raises_spec_error(folder: Path, text: str | bytes) -> None:
    refused_or_loaded(load_model, str(_file(folder, ".json", text)))


# ---- deployment, workload and plan.yaml -------------------------------------------------------

@fuzz(150)
@given(mutated(DEPLOYMENTS))
def test_a_mutated_deployment_loads_or_raises_spec_error(folder: Path, doc: Any) -> None:
    refused_or_loaded(load_deployment, doc)
    refused_or_loaded(load_deployment, _file(folder, ".yaml", yaml.safe_dump(doc)))


@fuzz(150)
@given(mutated(WORKLOADS))
def test_a_mutated_workload_loads_or_raises_spec_error(folder: Path, doc: Any) -> None:
    refused_or_loaded(load_workload, doc)
    refused_or_loaded(load_workload, _file(folder, ".yaml", yaml.safe_dump(doc)))


@fuzz(150)
@given(mutated([{"format": 1, "deployment": d, "workload": w, "slo": {"ttft_p90_ms": 3000}}
                for d, w in itertools.product(DEPLOYMENTS[:3], WORKLOADS[:2])]))
def test_a_mutated_plan_loads_or_raises_spec_error(folder: Path, doc: Any) -> None:
    refused_or_loaded(load_plan_or_deployment, _file(folder, ".yaml", yaml.safe_dump(doc)))


YAMLISH = st.text(st.sampled_from(list("ab:-[]{}&*!|>'\"#%@ \n\t0.9e")), max_size=60)
"""Text made of YAML's syntax characters: anchors, aliases, tags, flow and block collections."""


@fuzz(150)
@given(st.binary(max_size=120) | st.text(max_size=120) | YAMLISH)
def test_junk_yaml_raises_spec_error(folder: Path, text: str | bytes) -> None:
    path = _file(folder, ".yaml", text)
    for load in (load_deployment, load_workload, load_plan_or_deployment):
        refused_or_loaded(load, path)


YAML_TEXTS = [p.read_text() for p in sorted((ROOT / "examples").glob("*.yaml"))]
YAML_VALUES = st.sampled_from([
    "9" * 5000, "2001-02-30", "2001-12-14t21:59:43.10-05:00", "!!binary aGVsbG8=",
    "!!set {a, b}", "!!python/object:os.system ls", "!!str 3", "!!int x", "!!float inf",
    "*nowhere", "&a [*a, *a]", "{<<: 3}", ".nan", "-.inf", "0o10", "0x10", "1:30", "~", "yes",
    "[", "'", '"\\x"', "{a: {b: {c: [1, [2, [3]]]}}}", "? [a]", "|\n  text", "- - -", "@x",
])
"""YAML values Python or PyYAML may fail to build: huge integers, impossible dates, tags,
undefined and recursive aliases, bad merges, YAML 1.1 numbers, broken flow syntax."""


@st.composite
def yaml_with_a_bad_value(draw: st.DrawFn) -> str:
    """A real example YAML with one `key: value` line's value replaced."""
    lines = draw(st.sampled_from(YAML_TEXTS)).splitlines()
    i = draw(st.sampled_from([i for i, line in enumerate(lines) if ": " in line]))
    key = lines[i].split(": ", 1)[0]
    lines[i] = f"{key}: {draw(YAML_VALUES | YAMLISH)}"
    return "\n".join(lines) + "\n"


@fuzz(150)
@given(yaml_with_a_bad_value())
def test_yaml_with_a_bad_value_raises_spec_error(folder: Path, text: str) -> None:
    path = _file(folder, ".yaml", text)
    for load in (load_deployment, load_workload, load_plan_or_deployment):
        refused_or_loaded(load, path)


# ---- traces -----------------------------------------------------------------------------------

def _jsonl(rows: Any) -> str:
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def _csv(rows: Any) -> str:
    """The rows as a CSV with the columns of the first row (lists as their JSON text)."""
    rows = [r for r in rows if isinstance(r, dict)]
    cols = list(rows[0]) if rows else ["timestamp"]
    cell = lambda v: json.dumps(v) if isinstance(v, list | dict) else str(v)  # noqa: E731
    return "\n".join([",".join(cols)] + [",".join(f'"{cell(r.get(c, ""))}"' for c in cols)
                                          for r in rows]) + "\n"


def test_the_real_traces_still_load(folder: Path) -> None:
    assert len(read_trace(TRACE)) == 50
    assert len(read_trace(_file(folder, ".jsonl", _jsonl(SESSION_ROWS)))) == 3
    assert len(read_trace(_file(folder, ".csv", _csv(TRACE_ROWS)))) == len(TRACE_ROWS)


@fuzz(300)
@given(mutated([TRACE_ROWS, SESSION_ROWS]), st.sampled_from([".jsonl", ".csv"]),
       st.sampled_from([None, 2]))
def test_a_mutated_trace_loads_or_raises_spec_error(folder: Path, rows: Any, suffix: str,
                                                    limit: int | None) -> None:
    text = _jsonl(rows) if suffix == ".jsonl" else _csv(rows)
    trace = refused_or_loaded(read_trace, _file(folder, suffix, text), 1.0, limit)
    if trace is not None:
        assert (trace.input_len >= 1).all() and (trace.output_len >= 1).all()
        assert (trace.arrival_s >= 0).all()


@fuzz(100)
@given(st.binary(max_size=120) | st.text(max_size=120), st.sampled_from([".jsonl", ".csv"]))
def test_a_junk_trace_raises_spec_error(folder: Path, text: str | bytes, suffix: str) -> None:
    refused_or_loaded(read_trace, _file(folder, suffix, text))


# ---- plain regression tests: each bug the fuzzing found ----------------------------------------

def _tiny(**changes: Any) -> dict[str, Any]:
    cfg = _preset("tiny-moe")
    cfg.update(changes)
    return {k: v for k, v in cfg.items() if v is not None}


@pytest.mark.parametrize(("changes", "needle"), [
    ({"hidden_size": {"a": 1}}, "hidden_size={'a': 1}; it must be an integer from 1"),
    ({"hidden_size": True}, "hidden_size=true; it must be an integer"),
    ({"num_hidden_layers": "12"}, "num_hidden_layers='12'; it must be an integer"),
    ({"num_hidden_layers": math.inf}, "num_hidden_layers=inf"),
    ({"num_hidden_layers": math.nan}, "num_hidden_layers=nan"),
    ({"num_attention_heads": 0}, "num_attention_heads=0; it must be an integer from 1"),
    ({"num_key_value_heads": 4.0}, "num_key_value_heads=4.0"),
    ({"num_local_experts": 10**12}, "num_local_experts=1000000000000; it must be an integer "
                                    "from 0 to 65,536"),
    ({"vocab_size": -1}, "vocab_size=-1"),
    ({"architectures": "MixtralForCausalLM"}, "architectures='MixtralForCausalLM'; it must be "
                                              "a list"),
    ({"architectures": [["MixtralForCausalLM"]]}, "architectures[0]=['MixtralForCausalLM']; "
                                                  "each entry must be a string"),
    ({"layer_types": ["full_attention", 5]}, "layer_types[1]=5; each entry must be a string"),
    ({"mlp_only_layers": 3}, "mlp_only_layers=3; it must be a list"),
    ({"rope_scaling": "yarn"}, "rope_scaling='yarn'; it must be a JSON object"),
    ({"quantization_config": []}, "quantization_config=[]; it must be a JSON object"),
])
def test_a_bad_config_field_is_named_with_its_value_and_what_is_valid(changes, needle) -> None:
    with pytest.raises(SpecError) as e:
        model_from_config("tiny", _tiny(**changes))
    assert needle in str(e.value)


def test_a_bad_text_config_field_is_named_with_its_prefix() -> None:
    wrapped = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": {
        **_tiny(), "num_hidden_layers": -4}}
    with pytest.raises(SpecError, match=r"text_config\.num_hidden_layers=-4"):
        model_from_config("qwen35", wrapped)
    with pytest.raises(SpecError, match=r"text_config=\[1\]; it must be a JSON object"):
        model_from_config("qwen35", {**wrapped, "text_config": [1]})


@pytest.mark.parametrize(("changes", "needle"), [
    ({"num_key_value_heads": 3}, "num_key_value_heads=3; it must divide num_attention_heads"),
    ({"head_dim": None, "hidden_size": 100, "num_attention_heads": 8},
     "num_attention_heads=8, which does not divide hidden_size=100"),
    ({"layer_types": ["full_attention"]}, "1 layer_types and num_hidden_layers="),
    ({"mlp_only_layers": [0, 0]}, "mlp_only_layers=[0, 0]; it must list distinct layer"),
    ({"mlp_only_layers": [99]}, "mlp_only_layers=[99]"),
    ({"num_experts_per_tok": 99}, "99 experts per token (num_experts_per_tok) but"),
])
def test_fields_that_disagree_are_named(changes, needle) -> None:
    with pytest.raises(SpecError) as e:
        model_from_config("tiny", _tiny(**changes))
    assert needle in str(e.value)


def test_a_config_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(SpecError, match="must hold a JSON object, not list"):
        model_from_config("x", [1, 2])  # type: ignore[arg-type]


def test_an_unreadable_config_file_is_named(folder: Path) -> None:
    deep = _file(folder, ".json", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(SpecError, match="nested too deeply"):
        load_model(str(deep))
    huge = _file(folder, ".json", '{"hidden_size": ' + "9" * 5000 + "}")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_model(str(huge))
    with pytest.raises(SpecError, match="unknown model"):
        load_model("x/" + "a" * 5000)  # a name too long for the file system
    with pytest.raises(SpecError, match="unknown model"):
        load_model("a" * 5000)


def test_a_yaml_file_with_a_control_character_is_refused(folder: Path) -> None:
    path = _file(folder, ".yaml", "model: deepseek-v3\x08\n")
    with pytest.raises(SpecError, match="character #x0008 at position 18 is not printable"):
        load_deployment(path)


@pytest.mark.parametrize(("text", "needle"), [
    ("model: x\ndecode: {dep: " + "9" * 5000 + "}\n", "invalid YAML: Exceeds the limit (4300"),
    ("model: x\nhardware: 2001-02-30\n", "invalid YAML: day is out of range for month"),
])
def test_a_yaml_value_python_cannot_build_is_refused(folder: Path, text: str,
                                                      needle: str) -> None:
    for load in (load_deployment, load_plan_or_deployment):
        with pytest.raises(SpecError, match=needle.replace("(", r"\(")):
            load(_file(folder, ".yaml", text))


ROW = '{"timestamp": 0, "input_length": 5, "output_length": 1'


@pytest.mark.parametrize(("suffix", "text", "needle"), [
    (".jsonl", b"\xff\xfe", "is not UTF-8 text"),
    (".jsonl", ROW.replace("0,", "NaN,", 1) + "}", "timestamp=nan must be a finite number"),
    (".jsonl", ROW.replace("0,", "Infinity,", 1) + "}", "timestamp=inf must be a finite"),
    (".jsonl", ROW.replace("5", "true") + "}", "input_length=true must be a finite number"),
    (".jsonl", ROW.replace("5", "Infinity") + "}", "input_length=inf must be a finite"),
    (".jsonl", ROW.replace("5", "1e40") + "}", "input_length=1e+40 must be a whole number of "
                                              "tokens from 1 to 134,217,728"),
    (".jsonl", ROW.replace("5", "2.5") + "}", "input_length=2.5 must be a whole number"),
    (".jsonl", ROW.replace("5", "9" * 5000) + "}", "4300 digits"),
    (".jsonl", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    (".jsonl", ROW + ', "hash_ids": [[1]]}', "hash_ids[0]=[1]; each block id must be an integer"),
    (".jsonl", ROW + ', "hash_ids": [0, "fp8"]}', "hash_ids[1]='fp8'"),
    (".jsonl", ROW + ', "hash_ids": [Infinity]}', "hash_ids[0]=inf"),
    (".jsonl", ROW + ', "hash_ids": [-3]}', "hash_ids[0]=-3"),
    (".jsonl", ROW + ', "hash_ids": 7}', "hash_ids=7 must be a list of block ids"),
    (".csv", "timestamp,input_length,output_length,hash_ids\n0,5,1," + "9" * 30 + "\n",
     "hash_ids[0]='" + "9" * 20),
    (".csv", "timestamp,input_length,output_length\n0,5\x00,1\n", "input_length='5\\x00'"),
    (".csv", 'timestamp,input_length,output_length\n0,5,"' + "x" * 200_000 + '"\n',
     "not CSV (field larger than field limit"),
])
def test_a_bad_trace_row_is_named(folder: Path, suffix: str, text: str | bytes,
                                  needle: str) -> None:
    with pytest.raises(SpecError) as e:
        read_trace(_file(folder, suffix, text))
    assert needle in str(e.value)
