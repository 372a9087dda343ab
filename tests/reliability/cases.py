"""The bad inputs, one row each: class, command, and the token its refusal must name.

In a command, {tmp} is the case's scratch folder (also its working directory) and {repo} the
checkout; `files` are written into {tmp} first (a name ending in / is a folder). Nothing here
launches an engine or runs a real search: every input is refused before the work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml


@dataclass(frozen=True)
class Case:
    """One bad input."""

    kind: str
    """Its class (malformed YAML, NaN/inf, ...)."""
    argv: tuple[str, ...]
    """Arguments after `rackplan`."""
    needle: str
    """What the refusal's line must contain: the offending value or key."""
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    what: str = ""
    """The bad part of the files, in a few words (default: the files that differ from the
    good ones, cut short)."""
    short: tuple[str, ...] = ()
    """The command as the table shows it, when shorter than `argv` (searches: `...` for the
    base flags)."""
    known: str = ""
    """Why this case is not refused yet (the file to fix and its owner); empty when it is."""


TINY: dict[str, Any] = {
    "model": "tiny-moe", "hardware": "cpu", "precision": {"weights": "bf16", "kv_cache": "bf16"},
    "aggregated": {"instances": 1, "max_num_seqs": 8, "max_num_batched_tokens": 512},
}
"""A deployment that simulates in a moment (examples/tiny-moe-cpu-agg.yaml's)."""
WORK: dict[str, Any] = {
    "arrival": {"kind": "closed", "concurrency": 4}, "requests": 8,
    "input_tokens": {"kind": "fixed", "value": 64}, "output_tokens": {"kind": "fixed",
                                                                      "value": 16},
}
"""A workload of eight short requests."""
EX = "{repo}/examples/tiny-moe-cpu-agg.yaml"
"""A good plan (deployment, workload and prediction)."""
RESULT = json.dumps({"completed": 8, "duration": 1.0, "p90_ttft_ms": 2.0, "p90_tpot_ms": 1.5})
"""A benchmark result `bench --from-file` takes."""


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if v is _DROP:
            out.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


_DROP = object()


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def dep(**over: Any) -> dict[str, str]:
    """Files: d.yaml, the tiny deployment with `over` merged in."""
    return {"d.yaml": _yaml(_merge(TINY, over))}


def work(**over: Any) -> dict[str, str]:
    """Files: d.yaml (the tiny deployment) and w.yaml, the small workload with `over`."""
    return {**dep(), "w.yaml": _yaml(_merge(WORK, over))}


def flow(data: Mapping[str, Any]) -> str:
    """`data` as one line of flow-style YAML (a dropped key shows as ~removed)."""
    def clean(v: Any) -> Any:
        if v is _DROP:
            return "~removed"
        return {k: clean(x) for k, x in v.items()} if isinstance(v, Mapping) else v
    return yaml.safe_dump(clean(data), default_flow_style=True, width=10**6,
                          sort_keys=False).strip()


def sim_dep(kind: str, needle: str, **over: Any) -> Case:
    return Case(kind, ("simulate", "{tmp}/d.yaml"), needle, dep(**over),
                what=f"d.yaml with {flow(over)}")


def sim_work(kind: str, needle: str, **over: Any) -> Case:
    return Case(kind, ("simulate", "{tmp}/d.yaml", "--workload", "{tmp}/w.yaml"), needle,
                work(**over), what=f"w.yaml with {flow(over)}")


def raw_dep(kind: str, needle: str, text: str | bytes) -> Case:
    return Case(kind, ("simulate", "{tmp}/d.yaml"), needle, {"d.yaml": text})


def search(kind: str, needle: str, *flags: str, files: Mapping[str, str | bytes] | None = None,
           known: str = "") -> Case:
    """A search that must be refused before its first trial (tiny model, 8 GPUs, 1 trial)."""
    base = ("search", "--model", "tiny-moe", "--hardware", "cpu", "--gpus", "8",
            "--workload", "{tmp}/w.yaml", "--trials", "1", "--storage",
            "sqlite:///{tmp}/s.db", "--out", "{tmp}/plan.yaml")
    given = {flags[i] for i in range(len(flags)) if flags[i].startswith("--")}
    kept: list[str] = []
    i = 0
    while i < len(base):
        if base[i] in given:
            i += 2
            continue
        kept.append(base[i])
        i += 1
    return Case(kind, (*kept, *flags), needle, {"w.yaml": _yaml(WORK), **(files or {})},
                short=("search", "...", *flags), known=known)


def model_dir(kind: str, needle: str, config: str | bytes | None, via: str = "simulate"
              ) -> Case:
    """A model given as a folder whose config.json is `config` (None: no config.json)."""
    files: dict[str, str | bytes] = {"m/": ""} if config is None else {"m/config.json": config}
    what = ("m/ (a folder without config.json)" if config is None else
            f"m/config.json: {config!r}" if isinstance(config, bytes) else
            f"m/config.json: {config}")
    try:
        data = json.loads(config) if isinstance(config, str) else None
    except ValueError:
        data = None
    if isinstance(data, dict) and "architectures" in data:
        changed = {k: v for k, v in data.items() if TINY_CONFIG.get(k, _DROP) != v}
        changed.update({k: "~removed" for k in TINY_CONFIG if k not in data})
        what = f"m/config.json, a small MoE config with {json.dumps(changed)}"
    if via == "simulate":
        return Case(kind, ("simulate", "{tmp}/d.yaml"), needle,
                    {**files, "d.yaml": _yaml({**TINY, "model": "{tmp}/m"})},
                    what=f"d.yaml with {{model: <tmp>/m}}; {what}")
    return replace(search(kind, needle, "--model", "{tmp}/m", files=files), what=what)


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)) + "model: *i\nhardware: cpu\n"
"""Billion laughs: ten-fold aliases nine deep, 10^9 nodes from a file of a few hundred bytes."""
DEEP = "[" * 50_000 + "]" * 50_000
"""A document nested 50,000 deep."""
TINY_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000,
    "max_position_embeddings": 4096, "head_dim": 64,
}
"""A small, complete MoE config.json to break one key at a time."""


def cfg(**over: Any) -> str:
    return json.dumps({**TINY_CONFIG, **over})


def trace(rows: list[dict[str, Any]] | str, needle: str) -> Case:
    """A Mooncake trace replay whose JSONL file is `rows`."""
    text = rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows)
    return Case("broken trace", ("simulate", "{tmp}/d.yaml", "--workload", "{tmp}/w.yaml"),
                needle, {**dep(), "t.jsonl": text,
                         "w.yaml": _yaml({"arrival": {"kind": "trace", "path": "{tmp}/t.jsonl"},
                                          "requests": 4})},
                what=f"w.yaml replays the trace t.jsonl: {' '.join(text.split())}")


def row(**over: Any) -> dict[str, Any]:
    return {"timestamp": 0, "input_length": 64, "output_length": 16, **over}


def weka(text: str, needle: str, what: str = "") -> Case:
    """An AgentX session replay whose weka trace file is `text`."""
    return Case("broken trace", ("simulate", "{tmp}/d.yaml", "--workload", "{tmp}/w.yaml"),
                needle, {**dep(), "a.jsonl": text,
                         "w.yaml": _yaml({"arrival": {"kind": "sessions", "concurrency": 2,
                                                      "traces": "{tmp}/a.jsonl"},
                                          "requests": 4})},
                what=f"w.yaml replays AgentX sessions from a.jsonl: {what or text.strip()}")


def weka_req(**over: Any) -> str:
    req = {"t": 0.0, "type": "n", "in": 100, "out": 10, "hash_ids": [0], "think_time": 0.0,
           "api_time": 1.0, **over}
    return json.dumps({"id": "x", "block_size": 64, "requests": [req]}) + "\n"


NAN, INF = float("nan"), float("inf")
STEP = ("step", "{tmp}/d.yaml", "--role", "aggregated")
"""`step` on the tiny deployment's one role."""
POISSON = {"kind": "poisson", "concurrency": _DROP}
"""The small workload's arrival turned Poisson (add a rate)."""

CASES: tuple[Case, ...] = (
    # --- malformed YAML ------------------------------------------------------------------
    raw_dep("malformed YAML", "invalid YAML", "model: [tiny-moe\nhardware: cpu\n"),
    raw_dep("malformed YAML", "invalid YAML", "model: tiny-moe\n\thardware: cpu\n"),
    raw_dep("malformed YAML", "empty document", ""),
    raw_dep("malformed YAML", "a list", "- model: tiny-moe\n"),
    raw_dep("malformed YAML", "a str", "just words\n"),
    raw_dep("malformed YAML", "not UTF-8", b"model: \xff\xfe\n"),
    Case("malformed YAML", ("simulate", "{tmp}/nothing.yaml"), "nothing.yaml"),
    Case("malformed YAML", ("simulate", "{tmp}/dir"), "is a directory", {"dir/": ""}),
    Case("malformed YAML", ("simulate", "{tmp}/d.yaml", "--workload", "{tmp}/w.yaml"),
         "invalid YAML", {**dep(), "w.yaml": "arrival: {kind: closed\n"}),
    search("malformed YAML", "invalid YAML", files={"w.yaml": "requests: : 4\n"}),
    search("malformed YAML", "invalid YAML", "--slo-file", "{tmp}/slo.yaml",
           files={"slo.yaml": "{ttft_p90_ms: \n"}),
    search("malformed YAML", "an SLO file is a mapping", "--slo-file", "{tmp}/slo.yaml",
           files={"slo.yaml": "- 1\n- 2\n"}),
    Case("malformed YAML", ("compare", "{tmp}/a.yaml", EX), "invalid YAML",
         {"a.yaml": "x: [\n"}),
    Case("malformed YAML", ("compare", "{tmp}/a.yaml"), "a.yaml"),
    Case("malformed YAML", ("deploy", "{tmp}/p.yaml", "--target", "local", "--dry-run"),
         "invalid YAML", {"p.yaml": "deployment: {model: \n"}),
    Case("malformed YAML", ("bench", "{tmp}/p.yaml", "--from-file", "{tmp}/r.json"),
         "invalid YAML", {"p.yaml": "deployment: [\n", "r.json": "{}"}),
    raw_dep("malformed YAML", "nested too deeply", DEEP),
    raw_dep("malformed YAML", "invalid YAML", "model: tiny-moe\nmodel: *nope\n"),
    # --- huge YAML -----------------------------------------------------------------------
    raw_dep("huge YAML", "1,000,000 YAML nodes", LAUGHS),
    Case("huge YAML", ("simulate", "{tmp}/d.yaml", "--workload", "{tmp}/w.yaml"),
         "1,000,000 YAML nodes", {**dep(), "w.yaml": LAUGHS}),
    search("huge YAML", "1,000,000 YAML nodes", files={"w.yaml": LAUGHS}),
    search("huge YAML", "1,000,000 YAML nodes", "--slo-file", "{tmp}/slo.yaml",
           files={"slo.yaml": LAUGHS}),
    Case("huge YAML", ("compare", "{tmp}/a.yaml", "{tmp}/b.yaml"), "1,000,000 YAML nodes",
         {"a.yaml": LAUGHS, "b.yaml": LAUGHS}),
    Case("huge YAML", ("deploy", "{tmp}/p.yaml", "--target", "local", "--dry-run"),
         "1,000,000 YAML nodes", {"p.yaml": LAUGHS}),
    Case("huge YAML", ("bench", "{tmp}/p.yaml", "--from-file", "{tmp}/r.json"),
         "1,000,000 YAML nodes", {"p.yaml": LAUGHS, "r.json": "{}"}),
    raw_dep("huge YAML", "d.yaml", "a: &a [*a]\nmodel: *a\nhardware: cpu\n"),
    # --- wrong types ---------------------------------------------------------------------
    sim_dep("wrong type", "model=5", model=5),
    sim_dep("wrong type", "aggregated='big'", aggregated="big"),
    sim_dep("wrong type", "aggregated.instances='two'", aggregated={"instances": "two"}),
    sim_dep("wrong type", "aggregated.max_num_seqs=1.5", aggregated={"max_num_seqs": 1.5}),
    sim_dep("wrong type", "precision='fp8'", precision="fp8"),
    sim_dep("wrong type", "gpus=[8]", gpus=[8]),
    sim_dep("wrong type", "engine='tgi'", engine="tgi"),
    sim_dep("wrong type", "hardware 'h2000'", hardware="h2000"),
    sim_dep("wrong type", "model 'deepseek-v99'", model="deepseek-v99"),
    sim_dep("wrong type", "weights='fp3'", precision={"weights": "fp3"}),
    sim_dep("wrong type", "tokens='x'", aggregated={"speculative": {"tokens": "x"}}),
    sim_work("wrong type", "requests='many'", requests="many"),
    sim_work("wrong type", "arrival='closed'", arrival="closed"),
    sim_work("wrong type", "lottery", arrival={"kind": "lottery"}),
    sim_work("wrong type", "input_tokens.value=[1]", input_tokens={"value": [1]}),
    sim_work("wrong type", "mode='train'", mode="train"),
    search("wrong type", "fast", "--slo-file", "{tmp}/slo.yaml",
           files={"slo.yaml": "{ttft_p90_ms: fast}\n"}),
    search("wrong type", "latency_p90_ms", "--slo-file", "{tmp}/slo.yaml",
           files={"slo.yaml": "{latency_p90_ms: 100}\n"}),
    # --- bool as a number ----------------------------------------------------------------
    sim_dep("bool as number", "instances=true", aggregated={"instances": True}),
    sim_dep("bool as number", "max_num_seqs=false", aggregated={"max_num_seqs": False}),
    sim_dep("bool as number", "gpus=true", gpus=True),
    sim_dep("bool as number", "usd_per_gpu_hour=true", usd_per_gpu_hour=True),
    sim_dep("bool as number", "acceptance=true",
            aggregated={"speculative": {"acceptance": True}}),
    sim_work("bool as number", "requests=true", requests=True),
    sim_work("bool as number", "concurrency=true", arrival={"concurrency": True}),
    sim_work("bool as number", "value=true", input_tokens={"value": True}),
    sim_work("bool as number", "prefix_hit_rate=false", prefix_hit_rate=False),
    sim_work("bool as number", "seed=true", seed=True),
    search("bool as number", "true", "--slo-file", "{tmp}/slo.yaml",
           files={"slo.yaml": "{ttft_p90_ms: true}\n"}),
    # --- negative or zero ----------------------------------------------------------------
    sim_dep("negative/zero", "instances=0", aggregated={"instances": 0}),
    sim_dep("negative/zero", "max_num_seqs=-1", aggregated={"max_num_seqs": -1}),
    sim_dep("negative/zero", "max_num_batched_tokens=0", aggregated={"max_num_batched_tokens": 0}),
    sim_dep("negative/zero", "gpus=0", gpus=0),
    sim_dep("negative/zero", "gpu_memory_utilization=0", aggregated={"gpu_memory_utilization": 0}),
    sim_dep("negative/zero", "usd_per_gpu_hour=-1", usd_per_gpu_hour=-1),
    sim_work("negative/zero", "requests=0", requests=0),
    sim_work("negative/zero", "concurrency=0", arrival={"concurrency": 0}),
    sim_work("negative/zero", "rate=0", arrival={**POISSON, "rate": 0}),
    sim_work("negative/zero", "rate=-5", arrival={**POISSON, "rate": -5}),
    sim_work("negative/zero", "value=-3", output_tokens={"value": -3}),
    sim_work("negative/zero", "seed=-1", seed=-1),
    search("negative/zero", "--gpus", "--gpus", "0"),
    search("negative/zero", "--gpus", "--gpus", "-8"),
    search("negative/zero", "--trials", "--trials", "0"),
    search("negative/zero", "--trials", "--trials", "-5"),
    search("negative/zero", "--batch", "--batch", "0"),
    search("negative/zero", "--workers", "--workers", "0"),
    search("negative/zero", "--workers", "--workers", "-1"),
    search("negative/zero", "--max-simulations", "--max-simulations", "0"),
    search("negative/zero", "--seed", "--seed", "-1"),
    search("negative/zero", "-5", "--ttft", "-5"),
    search("negative/zero", "0", "--tpot", "0"),
    Case("negative/zero", (*STEP, "--batch", "0"), "--batch", dep()),
    Case("negative/zero", (*STEP, "--context", "-1"), "--context", dep()),
    Case("negative/zero", ("step", "{tmp}/d.yaml", "--cached", "-1"), "--cached", dep()),
    Case("negative/zero", (*STEP, "--ranks-busy", "0"), "--ranks-busy", dep()),
    Case("negative/zero", ("validate", "--sample", "-1", "--out", "{tmp}/v.csv"), "--sample"),
    Case("negative/zero", ("validate", "--workers", "0", "--out", "{tmp}/v.csv"), "--workers"),
    Case("negative/zero", ("ui", "--port", "0"), "--port"),
    Case("negative/zero", ("ui", "--port", "70000"), "--port"),
    Case("negative/zero", ("deploy", EX, "--target", "local", "--dry-run", "--timeout", "0"),
         "--timeout"),
    Case("negative/zero", ("calibrate", "--max-seconds", "0", "--out", "{tmp}/cal"),
         "--max-seconds"),
    Case("negative/zero", ("calibrate", "--threads", "0", "--out", "{tmp}/cal"), "--threads"),
    # --- NaN and infinity ----------------------------------------------------------------
    sim_work("NaN/inf", "rate=nan", arrival={"kind": "poisson", "rate": NAN,
                                             "concurrency": _DROP}),
    sim_work("NaN/inf", "rate=inf", arrival={"kind": "poisson", "rate": INF,
                                             "concurrency": _DROP}),
    sim_work("NaN/inf", "think_time_s=inf", sessions={"turns": 2, "think_time_s": INF}),
    sim_work("NaN/inf", "median=nan", input_tokens={"kind": "lognormal", "median": NAN,
                                                    "value": _DROP}),
    sim_dep("NaN/inf", "acceptance=nan", aggregated={"speculative": {"acceptance": NAN}}),
    sim_dep("NaN/inf", "usd_per_gpu_hour=inf", usd_per_gpu_hour=INF),
    search("NaN/inf", "nan", "--ttft", "nan"),
    search("NaN/inf", "inf", "--tpot", "inf"),
    search("NaN/inf", "ttft_p90_ms=nan", "--slo", "ttft_p90_ms=nan"),
    search("NaN/inf", "ttft:nan", "--goodput", "ttft:nan"),
    search("NaN/inf", "nan", "--target-rate", "nan"),
    search("NaN/inf", "inf", "--target-rate", "infreq/s"),
    search("NaN/inf", "nan", "--slo-file", "{tmp}/slo.yaml",
           files={"slo.yaml": "{ttft_p90_ms: .nan}\n"}),
    Case("NaN/inf", ("deploy", EX, "--target", "local", "--dry-run", "--timeout", "nan"),
         "--timeout"),
    Case("NaN/inf", ("deploy", EX, "--target", "local", "--dry-run", "--timeout", "inf"),
         "--timeout"),
    Case("NaN/inf", ("calibrate", "--max-seconds", "nan", "--out", "{tmp}/cal"),
         "--max-seconds"),
    Case("NaN/inf", ("calibrate", "--max-seconds", "inf", "--out", "{tmp}/cal"),
         "--max-seconds"),
    # --- unknown and misspelt keys -------------------------------------------------------
    Case("unknown key", ("simulate", "{tmp}/d.yaml"), "'modle' (did you mean model?)",
         {"d.yaml": _yaml({**{k: v for k, v in TINY.items() if k != "model"},
                           "modle": "tiny-moe"})}),
    Case("unknown key", ("simulate", "{tmp}/d.yaml"), "'hardwre' (did you mean hardware?)",
         {"d.yaml": _yaml({**{k: v for k, v in TINY.items() if k != "hardware"},
                           "hardwre": "cpu"})}),
    sim_dep("unknown key", "'max_num_seq'", aggregated={"max_num_seq": 8}),
    sim_dep("unknown key", "'weight'", precision={"weight": "fp8"}),
    sim_dep("unknown key", "'colour'", colour="blue"),
    Case("wrong spec kind", ("simulate", "{tmp}/w.yaml"), "is a workload spec",
         {"w.yaml": _yaml(WORK)}),
    Case("wrong spec kind", ("simulate", "{tmp}/d.yaml", "--workload", "{tmp}/d.yaml"),
         "is a deployment spec", dep()),
    Case("wrong spec kind", ("simulate", "{tmp}/d.yaml", "--workload", "{tmp}/p.yaml"),
         "a plan without a workload", {**dep(), "p.yaml": _yaml({"deployment": TINY})}),
    sim_work("unknown key", "'request'", request=10),
    sim_work("unknown key", "'concurency'", arrival={"concurency": 4, "concurrency": _DROP}),
    search("unknown key", "tftt_p90_ms", "--slo", "tftt_p90_ms=100"),
    search("unknown key", "h2000", "--hardware", "h2000"),
    search("unknown key", "deepseek-v99", "--model", "deepseek-v99"),
    search("unknown key", "agentxx", "--workload", "agentxx"),
    search("unknown key", "bogus", "--objective", "bogus"),
    Case("unknown key", ("validate", "--backend", "vlm", "--out", "{tmp}/v.csv"), "vlm"),
    Case("unknown key", ("validate", "--mode", "both", "--out", "{tmp}/v.csv"), "both"),
    Case("unknown key", ("calibrate", "--only", "gemm,foo", "--out", "{tmp}/cal"), "foo"),
    Case("unknown key", ("calibrate", "--device", "tpu", "--out", "{tmp}/cal"), "tpu"),
    Case("unknown key", ("step", "{tmp}/d.yaml", "--role", "router"), "router", dep()),
    Case("unknown key", ("frobnicate",), "frobnicate"),
    # --- broken model config.json --------------------------------------------------------
    model_dir("broken config.json", "not valid JSON", "{not json"),
    model_dir("broken config.json", "JSON object", "[1, 2]"),
    model_dir("broken config.json", "config.json", None),
    model_dir("broken config.json", "'hidden_size'",
              json.dumps({k: v for k, v in TINY_CONFIG.items() if k != "hidden_size"})),
    model_dir("broken config.json", "'LlamaForSomething'",
              cfg(architectures=["LlamaForSomething"])),
    model_dir("broken config.json", "num_hidden_layers", cfg(num_hidden_layers=-2)),
    model_dir("broken config.json", "num_hidden_layers", cfg(num_hidden_layers=True)),
    model_dir("broken config.json", "hidden_size", cfg(hidden_size="big")),
    model_dir("broken config.json", "num_local_experts", cfg(num_local_experts=10**12)),
    model_dir("broken config.json", "hidden_size=", cfg(hidden_size=NAN)),
    model_dir("broken config.json", "not valid JSON", "{not json", via="search"),
    model_dir("broken config.json", "num_hidden_layers", cfg(num_hidden_layers=0),
              via="search"),
    # --- broken traces -------------------------------------------------------------------
    Case("broken trace", ("simulate", "{tmp}/d.yaml", "--workload", "{tmp}/w.yaml"),
         "nope.jsonl", {**dep(), "w.yaml": _yaml({"arrival": {"kind": "trace",
                                                               "path": "{tmp}/nope.jsonl"}})}),
    trace("{not json\n", "not a JSON object"),
    trace([row(timestamp="soon")], "timestamp"),
    trace([row(timestamp=-5)], "timestamp"),
    trace("{\"timestamp\": NaN, \"input_length\": 64, \"output_length\": 16}\n", "timestamp"),
    trace("{\"timestamp\": Infinity, \"input_length\": 64, \"output_length\": 16}\n",
          "timestamp"),
    trace([{"timestamp": 0, "input_length": 64}], "'output_length'"),
    trace([row(input_length=-64)], "input_length=-64"),
    trace([row(output_length=0)], "output_length=0"),
    trace([row(input_length=10**12)], "input_length"),
    trace([row(input_length=True)], "input_length"),
    weka("{not json\n", "not valid JSON"),
    weka(weka_req(**{"in": -5}), "-5", "a request with in: -5"),
    weka(weka_req(t=NAN), "t=nan", "a request with t: NaN"),
    weka(weka_req(out=10**12), "out", "a request with out: 1000000000000"),
    Case("broken trace", ("simulate", "{tmp}/d.yaml", "--workload", "{tmp}/w.yaml"),
         "no .json or .jsonl", {**dep(), "traces/": "",
                                "w.yaml": _yaml({"arrival": {"kind": "sessions",
                                                             "concurrency": 2,
                                                             "traces": "{tmp}/traces"}})}),
    # --- unwritable outputs --------------------------------------------------------------
    search("unwritable output", "{tmp}/file/plan.yaml", "--out", "{tmp}/file/plan.yaml",
           files={"file": "x"}),
    search("unwritable output", "/proc/rackplan/plan.yaml", "--out", "/proc/rackplan/plan.yaml"),
    search("unwritable output", "is a folder", "--out", "{tmp}/dir", files={"dir/": ""}),
    search("unwritable output", "{tmp}/file/s.db", "--storage", "sqlite:///{tmp}/file/s.db",
           files={"file": "x"}),
    search("unwritable output", "/proc/rackplan/s.db", "--storage",
           "sqlite:////proc/rackplan/s.db"),
    search("unwritable output", "{tmp}/file/j.log", "--storage", "journal:{tmp}/file/j.log",
           files={"file": "x"}),
    search("unwritable output", "{tmp}/file/c.png", "--plot", "{tmp}/file/c.png",
           files={"file": "x"}),
    search("unwritable output", "c.gif", "--plot", "{tmp}/c.gif"),
    Case("unwritable output", ("validate", "--out", "{tmp}/file/v.csv"), "{tmp}/file/v.csv",
         {"file": "x"}),
    Case("unwritable output", ("validate", "--out", "/proc/rackplan/v.csv"),
         "/proc/rackplan/v.csv"),
    Case("unwritable output", ("calibrate", "--quick", "--out", "{tmp}/file/cal"),
         "{tmp}/file/cal", {"file": "x"}),
    Case("unwritable output", ("calibrate", "--quick", "--out", "/proc/rackplan/cal"),
         "/proc/rackplan/cal"),
    Case("unwritable output", ("deploy", EX, "--target", "kubernetes", "--dry-run", "--out",
                               "{tmp}/file/k8s", "--model-path", "/models/tiny"),
         "{tmp}/file/k8s", {"file": "x"}),
    Case("unwritable output", ("deploy", EX, "--target", "slurm", "--dry-run", "--out",
                               "/proc/rackplan/slurm"), "/proc/rackplan/slurm"),
    Case("unwritable output", ("bench", EX, "--from-file", "{tmp}/r.json", "--out",
                               "{tmp}/file/b"), "{tmp}/file/b",
         {"file": "x", "r.json": RESULT}),
    # --- bad storage URLs ----------------------------------------------------------------
    search("bad storage URL", "junk", "--storage", "junk"),
    search("bad storage URL", "ftp://", "--storage", "ftp://example/db"),
    search("bad storage URL", "postgresql://127.0.0.1:1/x", "--storage",
           "postgresql://127.0.0.1:1/x"),
    search("bad storage URL", "sqlite:///", "--storage", "sqlite:///"),
    search("bad storage URL", "journal:", "--storage", "journal:"),
    # --- bad flag values -----------------------------------------------------------------
    search("bad flag value", "junk", "--trials", "junk"),
    search("bad flag value", "junk", "--target-rate", "junk"),
    search("bad flag value", "0", "--target-rate", "0"),
    search("bad flag value", "-5req/s", "--target-rate=-5req/s"),
    search("bad flag value", "pareto", "--target-rate", "5", "--objective", "pareto"),
    search("bad flag value", "-1", "--loads", "0,-1"),
    search("bad flag value", "junk", "--loads", "junk"),
    search("bad flag value", "--loads", "--loads", "1e12"),
    search("bad flag value", "foo:10", "--goodput", "foo:10"),
    search("bad flag value", "ttft", "--goodput", "ttft"),
    search("bad flag value", "ttft_p90_ms", "--slo", "ttft_p90_ms"),
    search("bad flag value", "tok_s_user_p90<=5", "--slo", "tok_s_user_p90<=5"),
    search("bad flag value", "--trials", "--trials", "1000000000"),
    search("bad flag value", "--batch", "--batch", "1000000"),
    search("bad flag value", "--workers", "--workers", "100000"),
    search("bad flag value", "--gpus", "--gpus", "1000000000"),
    search("bad flag value", "--max-simulations", "--max-simulations", "-3"),
    search("bad flag value", "--workers", "--workers", "4", "--batch", "2"),
    Case("bad flag value", (*STEP, "--batch", "1000000000"), "--batch", dep()),
    Case("bad flag value", (*STEP, "--context", "1000000000000"), "--context",
         dep()),
    Case("bad flag value", (*STEP, "--ranks-busy",
                            "99"), "--ranks-busy", dep()),
    Case("bad flag value", ("validate", "--sample", "junk"), "junk"),
    Case("bad flag value", ("validate", "--workers", "100000", "--out", "{tmp}/v.csv"),
         "--workers"),
    Case("bad flag value", ("ui", "--port", "http"), "http"),
    Case("bad flag value", ("models", "--yaml"), "--yaml"),
    # --- oversized work ------------------------------------------------------------------
    sim_work("too large", "requests=1000000000000", requests=10**12),
    sim_work("too large", "concurrency=1000000000", arrival={"concurrency": 10**9}),
    sim_work("too large", "value=1000000000", input_tokens={"value": 10**9}),
    sim_work("too large", "value=1000000000", output_tokens={"value": 10**9}),
    sim_work("too large", "high=1000000000", input_tokens={"kind": "uniform", "low": 1,
                                                           "high": 10**9, "value": _DROP}),
    sim_work("too large", "context_tokens=1000000000", mode="decode_only",
             context_tokens=10**9),
    sim_work("past the model's context", "context of 2,048 tokens",
             input_tokens={"value": 4000}),
    sim_work("past the model's context", "context_tokens 2,000",
             mode="decode_only", context_tokens=2000, input_tokens={"value": 100}),
    sim_dep("too large", "max_num_seqs=1000000000", aggregated={"max_num_seqs": 10**9}),
    sim_dep("too large", "instances=1000000000", aggregated={"instances": 10**9}),
    sim_dep("too large", "max_num_batched_tokens=1000000000000",
            aggregated={"max_num_batched_tokens": 10**12}),
    sim_dep("too large", "redundant_experts=1000000000",
            aggregated={"dep": 1, "redundant_experts": 10**9}),
    sim_dep("too large", "tokens=1000000", aggregated={"speculative": {"tokens": 10**6}}),
    sim_dep("too large", "host_cache_gb=1000000000000.0", aggregated={"host_cache_gb": 1e12}),
    sim_dep("too large", "gpus=1000000000", gpus=10**9),
    sim_dep("too large", "dep=1000000000", aggregated={"dep": 10**9}),
    sim_work("too large", "rate=1e-12", arrival={"kind": "poisson", "rate": 1e-12,
                                                 "concurrency": _DROP}),
    sim_work("too large", "turns=1000000000", sessions={"turns": 10**9}),
    sim_work("too large", "think_time_s=1e+30", sessions={"turns": 2, "think_time_s": 1e30}),
    # --- deploy and bench with bad plans -------------------------------------------------
    Case("bad plan", ("deploy", EX, "--target", "junk", "--dry-run"), "junk"),
    Case("bad plan", ("deploy", "{tmp}/none.yaml", "--target", "local", "--dry-run"),
         "none.yaml"),
    Case("bad plan", ("deploy", EX, "--target", "kubernetes", "--flavor", "junk", "--dry-run",
                      "--out", "{tmp}/k"), "junk"),
    Case("bad plan", ("deploy", EX, "--target", "kubernetes", "--routing", "junk",
                      "--dry-run", "--out", "{tmp}/k"), "junk"),
    Case("bad plan", ("deploy", EX, "--target", "local", "--flavor", "llm-d", "--dry-run"),
         "--flavor"),
    Case("bad plan", ("deploy", EX, "--target", "kubernetes", "--model-volume", "nfs:x",
                      "--dry-run", "--out", "{tmp}/k"), "nfs:x"),
    Case("bad plan", ("deploy", "{tmp}/d.yaml", "--target", "local", "--dry-run"),
         "instances=0", dep(aggregated={"instances": 0}),
         what="d.yaml with {aggregated: {instances: 0}}"),
    Case("bad plan", ("deploy", "{tmp}/p.yaml", "--target", "local", "--dry-run"),
         "instances=true", {"p.yaml": _yaml({"format": 1, "deployment": _merge(
             TINY, {"aggregated": {"instances": True}})})}),
    Case("bad plan", ("bench", "{tmp}/none.yaml", "--from-file", "{tmp}/r.json"), "none.yaml",
         {"r.json": "{}"}),
    Case("bad plan", ("bench", EX, "--from-file", "{tmp}/missing.json"), "missing.json"),
    Case("bad plan", ("bench", EX, "--from-file", "{tmp}/r.json"), "r.json",
         {"r.json": "{not json"}),
    Case("bad plan", ("bench", EX, "--from-file", "{tmp}/r.json"), "r.json",
         {"r.json": "[1, 2, 3]"}),
    Case("bad plan", ("bench", EX, "--from-file", "{tmp}/r.json"), "completed",
         {"r.json": json.dumps({"completed": "many"})}),
    Case("bad plan", ("bench", EX, "--url", "not a url"), "not a url"),
    Case("bad plan", ("compare", "{tmp}/p.yaml", EX), "p.yaml",
         {"p.yaml": _yaml({"format": 1, "deployment": "tiny"})}),
)
