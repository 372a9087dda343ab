"""`rackplan models | hardware | step`: the CLI contract, including its errors."""

import json
import math
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from simulator.cost import check_memory
from simulator.specs.deployment import RoleSpec
from simulator.specs.errors import SpecError
from simulator.specs.hardware import HARDWARE, load_hardware
from simulator.specs.model import load_model, preset_names
from tests.planner.cli_run import assert_one_line_error, run_cli

GPUS = [name for name in HARDWARE if name != "cpu"]



def smallest_dep_that_fits(model_name: str, hw_name: str) -> int:
    model, hw = load_model(model_name), load_hardware(hw_name)
    for dep in (1, 2, 4, 8, 16, 32, 64):
        if model.n_routed_experts % dep:
            continue
        try:
            check_memory("decode", model, hw, RoleSpec(dep=dep), "fp8", "fp8")
            return dep
        except SpecError:
            continue
    raise AssertionError(f"{model_name} fits no DEP size on {hw_name}")


def write(tmp_path: Path, doc: dict, name: str = "d.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("hw", GPUS)
@pytest.mark.parametrize("model", preset_names())
def test_step_for_every_model_on_every_gpu(model, hw, tmp_path, capsys):
    dep = smallest_dep_that_fits(model, hw)
    path = write(tmp_path, {"model": model, "hardware": hw,
                            "prefill": {"dep": dep}, "decode": {"dep": dep}})
    for role in ("decode", "prefill"):
        assert main(["step", str(path), "--role", role, "--batch", "16", "--context", "2048",
                     "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["total_ms"] > 0 and math.isfinite(out["total_ms"])
        assert sum(out["breakdown_ms"].values()) == pytest.approx(out["total_ms"])
        assert out["provenance"]


def test_step_s_default_context_stays_within_the_model_s(tmp_path, capsys):
    """4,096 tokens unless the model's context is shorter (tiny-moe: 2,048), less what is
    cached; a context given past it is refused (test_step_prices_a_prompt_chunk_...)."""
    path = write(tmp_path, {"model": "tiny-moe", "hardware": "h100",
                            "prefill": {"dep": 1}, "decode": {"dep": 1}})
    assert main(["step", str(path), "--batch", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["context"] == 2048
    assert main(["step", str(path), "--role", "prefill", "--batch", "1", "--cached", "1500",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["context"] == 548
    path = write(tmp_path, {"model": "deepseek-v3", "hardware": "h200",
                            "prefill": {"dep": 8}, "decode": {"dep": 8}}, "v3.yaml")
    assert main(["step", str(path), "--batch", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["context"] == 4096


def test_models_and_hardware_list_every_preset(capsys):
    assert main(["models", "--json"]) == 0
    names = [m["name"] for m in json.loads(capsys.readouterr().out)["models"]]
    assert names == preset_names()
    assert main(["hardware", "--json"]) == 0
    assert [h["name"] for h in json.loads(capsys.readouterr().out)["hardware"]] == list(HARDWARE)


def test_step_prints_a_table_for_people():
    r = run_cli("step", "examples/deepseek-v3-h200-dep8.yaml", "--batch", "128")
    assert r.returncode == 0, r.stderr
    assert "step time" in r.stdout and "routed_experts" in r.stdout



def test_bad_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: deepseek-v3\nprefill: [dep: 8\n")
    assert_one_line_error(run_cli("step", str(path)), "bad.yaml")


def test_unknown_model(tmp_path):
    path = write(tmp_path, {"model": "llama-9", "hardware": "h200", "aggregated": {"dep": 8}})
    assert_one_line_error(run_cli("step", str(path), "--role", "aggregated"), "llama-9",
                          "deepseek-v3")


def test_dep_that_does_not_divide_the_experts(tmp_path):
    path = write(tmp_path, {"model": "deepseek-v3", "hardware": "h200",
                            "prefill": {"dep": 8}, "decode": {"dep": 10, "redundant_experts": 32}})
    assert_one_line_error(run_cli("step", str(path)), "dep=10", "256+32=288")


def test_deployment_over_memory(tmp_path):
    path = write(tmp_path, {"model": "kimi-k2", "hardware": "h100",
                            "prefill": {"dep": 8}, "decode": {"dep": 8}})
    assert_one_line_error(run_cli("step", str(path)), "kimi-k2", "GB weights", "DEP8")


def test_unknown_key(tmp_path):
    path = write(tmp_path, {"model": "deepseek-v3", "hardware": "h200",
                            "prefill": {"dep": 8}, "decode": {"dep": 8, "max_seqs": 64}})
    assert_one_line_error(run_cli("step", str(path)), "max_seqs")


def test_role_missing_from_the_deployment(tmp_path):
    path = write(tmp_path, {"model": "deepseek-v3", "hardware": "h200",
                            "aggregated": {"dep": 8}})
    assert_one_line_error(run_cli("step", str(path), "--role", "prefill"), "--role='prefill'")


def test_simulate_json_is_deterministic_and_has_the_contract_keys():
    args = ("simulate", "examples/deepseek-v3-h200-pd.yaml", "--workload",
            "examples/workload-chat.yaml", "--json")
    first, second = run_cli(*args), run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    m = json.loads(first.stdout)
    for key in ("gpus", "duration_s", "completed", "throughput_tok_s_gpu", "output_tok_s_gpu",
                "prefill_input_tok_s_gpu", "decode_output_tok_s_gpu", "ttft_ms", "tpot_ms",
                "itl_ms", "tok_s_user", "step_breakdown", "expert_imbalance",
                "cost_per_mtok_usd"):
        assert key in m, key
    assert m["gpus"] == 72 and m["completed"] == 2000


def test_simulate_prints_a_table_for_people():
    r = run_cli("simulate", "examples/deepseek-v3-h200-pd.yaml", "--workload",
                "examples/workload-chat.yaml")
    assert r.returncode == 0, r.stderr
    assert "TTFT p50 / p90 / p99" in r.stdout


def test_simulate_bad_workload(tmp_path):
    path = write(tmp_path, {"arrival": {"kind": "sometimes"}}, "w.yaml")
    assert_one_line_error(run_cli("simulate", "examples/deepseek-v3-h200-pd.yaml",
                                  "--workload", str(path)), "sometimes", "closed")


def test_simulate_takes_a_workload_preset_by_name(capsys):
    """`simulate --workload NAME` reads the preset `search --workload NAME` reads: the same
    figures as its YAML given by path; a name that is neither is one line naming the presets."""
    from importlib import resources
    deck = "examples/deepseek-v3-h200-pd.yaml"
    preset = resources.files("planner").joinpath("presets/agentic.yaml")
    with resources.as_file(preset) as path:
        assert main(["simulate", deck, "--workload", str(path), "--json"]) == 0
        by_path = capsys.readouterr().out
    assert main(["simulate", deck, "--workload", "agentic", "--json"]) == 0
    assert capsys.readouterr().out == by_path
    assert json.loads(by_path)["completed"] == 640
    assert_one_line_error(run_cli("simulate", deck, "--workload", "agentik"), "'agentik'",
                          "agentic, agentx, chat")


def test_simulate_runs_a_one_role_deck_in_its_isolated_mode(tmp_path, capsys):
    """Without --workload a deck of one role runs the bench mode that role measures instead of
    refusing serve: a decode deck at the batch it holds (instances x DP ranks x sequences),
    ten requests a user; a prefill deck prefill_only at the default users. Each says so."""
    decode = write(tmp_path, {"model": "deepseek-v3", "hardware": "h200",
                              "decode": {"instances": 2, "dep": 8, "max_num_seqs": 4}}, "d.yaml")
    assert main(["simulate", str(decode), "--json"]) == 0
    out = capsys.readouterr()
    m = json.loads(out.out)
    assert m["completed"] == 10 * 2 * 8 * 4  # 64 users, ten requests each
    assert m["prefill_input_tok_s_gpu"] is None and m["decode_output_tok_s_gpu"] > 0
    assert "mode decode_only: 64 users, 640 requests" in out.err
    prefill = write(tmp_path, {"model": "deepseek-v3", "hardware": "h200",
                               "prefill": {"dep": 8}}, "p.yaml")
    assert main(["simulate", str(prefill), "--json"]) == 0
    out = capsys.readouterr()
    m = json.loads(out.out)
    assert m["completed"] == 4000 and m["decode_output_tok_s_gpu"] is None
    assert "mode prefill_only: 2,048 users, 4,000 requests" in out.err


def test_step_prices_a_plans_deployment(tmp_path, capsys):
    """`rackplan step PLAN.yaml` prices the plan's deployment, as `simulate` takes plans: the
    same figures as the deployment written alone."""
    plan = yaml.safe_load(Path("examples/tiny-moe-cpu-pd.yaml").read_text())
    alone = write(tmp_path, plan["deployment"], "alone.yaml")
    args = ["--role", "prefill", "--batch", "2", "--context", "64", "--json"]
    assert main(["step", "examples/tiny-moe-cpu-pd.yaml", *args]) == 0
    from_plan = json.loads(capsys.readouterr().out)
    assert main(["step", str(alone), *args]) == 0
    assert json.loads(capsys.readouterr().out) == from_plan
    assert from_plan["total_ms"] > 0


@pytest.mark.parametrize(("args", "code"), [
    (("models", "--json"), 141),  # print: ours, SIGPIPE's 128 + 13
    (("models",), 1),  # a rich table: rich's own quiet exit
])
def test_a_reader_that_goes_away_ends_the_command_quietly(args, code):
    """`rackplan ... | head` whose reader closes the pipe first: a non-zero exit and no
    traceback on stderr (the JSON printer had one)."""
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the CLI has written anything (its imports take longer)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == code, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_a_spec_of_the_other_kind_is_named(tmp_path):
    """A workload file where a deployment goes (or the reverse) is one line saying which spec it
    is, not a list of unknown keys."""
    assert_one_line_error(run_cli("simulate", "examples/workload-chat.yaml"),
                          "examples/workload-chat.yaml: is a workload spec", "not a deployment")
    assert_one_line_error(run_cli("simulate", "examples/tiny-moe-cpu-agg.yaml", "--workload",
                                  "examples/deepseek-v3-h200-dep8.yaml"),
                          "is a deployment spec", "not a workload spec")


def test_simulate_takes_a_plans_workload(tmp_path, capsys):
    """--workload PLAN.yaml replays the plan's own workload (another deployment under the
    traffic a plan was made for); a plan without one is refused in one line."""
    plan = "examples/tiny-moe-cpu-pd.yaml"
    assert main(["simulate", "examples/tiny-moe-cpu-agg.yaml", "--workload", plan,
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 8  # the plan's 8 requests
    bare = yaml.safe_load(Path(plan).read_text())
    del bare["workload"]
    path = write(tmp_path, bare, "plan.yaml")
    assert_one_line_error(run_cli("simulate", "examples/tiny-moe-cpu-agg.yaml", "--workload",
                                  str(path)), "a plan without a workload", "agentx")


def test_v4_config_with_a_bad_compress_ratio_is_one_line(tmp_path):
    from importlib import resources
    cfg = json.loads(resources.files("simulator.specs").joinpath(
        "presets/models/deepseek-v4-flash.json").read_text())
    cfg["compress_ratios"][5] = 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    path = write(tmp_path, {"model": str(tmp_path / "config.json"), "hardware": "gb300",
                            "prefill": {"dep": 4}, "decode": {"dep": 4}})
    assert_one_line_error(run_cli("step", str(path)), "compress_ratios holds 64",
                          "0, 4, 128")


def test_step_prices_a_prompt_chunk_after_a_cached_prefix(tmp_path, capsys):
    path = write(tmp_path, {"model": "deepseek-v4-flash", "hardware": "gb300",
                            "prefill": {"dep": 2}, "decode": {"dep": 2}})
    got = {}
    for cached in (0, 65536):
        assert main(["step", str(path), "--role", "prefill", "--batch", "1", "--context", "4096",
                     "--cached", str(cached), "--ranks-busy", "1", "--json"]) == 0
        got[cached] = json.loads(capsys.readouterr().out)
    assert got[65536]["total_ms"] > got[0]["total_ms"]
    assert (got[0]["cached"], got[0]["ranks_busy"]) == (0, 1)
    assert_one_line_error(run_cli("step", str(path), "--cached", "100"), "--cached=100",
                          "--role prefill")
    assert_one_line_error(run_cli("step", str(path), "--ranks-busy", "3"), "--ranks-busy=3",
                          "between 1 and")
    # past the model's context window (V4-Flash: 1,048,576 tokens after its YaRN factor)
    assert main(["step", str(path), "--batch", "1", "--context", "1048576", "--json"]) == 0
    capsys.readouterr()
    assert_one_line_error(run_cli("step", str(path), "--batch", "1", "--context", "1048577"),
                          "--context=1,048,577", "context of 1,048,576")
    assert_one_line_error(run_cli("step", str(path), "--role", "prefill", "--context", "8192",
                                  "--cached", "1048000"),
                          "--cached=1,048,000 plus --context=8,192", "give at most 1,048,576")


def test_step_prices_the_deployments_only_role_when_none_is_named(tmp_path, capsys):
    """decode when the deployment has it; else its aggregated role, or its prefill role (a
    prefill-only bench), which then takes --cached."""
    decks = {"aggregated": {"aggregated": {"tp": 8}},
             "prefill": {"prefill": {"dep": 8}},
             "decode": {"prefill": {"dep": 8}, "decode": {"dep": 8}}}
    for role, roles in decks.items():
        path = write(tmp_path, {"model": "deepseek-v3", "hardware": "h200", **roles},
                     f"{role}.yaml")
        assert main(["step", str(path), "--batch", "8", "--context", "1024", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["role"] == role and out["total_ms"] > 0
    assert main(["step", str(tmp_path / "prefill.yaml"), "--batch", "1", "--context", "1024",
                 "--cached", "4096", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cached"] == 4096


def test_workloads_lists_every_preset_and_each_simulates(tmp_path):
    r = run_cli("workloads", "--json")
    assert r.returncode == 0, r.stderr
    rows = {w["name"]: w for w in json.loads(r.stdout)["workloads"]}
    assert {"agentx", "chat", "long-context", "prefill-heavy"} <= set(rows)
    assert rows["chat"]["arrival"] == "closed, concurrency 256"
    assert all(w["summary"].endswith(".") for w in rows.values())
    from planner.defaults import load_workload_arg
    from simulator.des import simulate
    from simulator.specs.loading import load_deployment
    deployment = load_deployment(Path("examples/deepseek-v3-h200-pd.yaml"))
    for name in ("chat", "long-context", "prefill-heavy"):
        small = load_workload_arg(name).model_copy(update={"requests": 12})
        m = simulate(deployment, small).metrics()
        assert m["completed"] == 12, name


def _plan_file(path, dep, throughput):
    path.write_text(yaml.safe_dump({
        "format": 1,
        "deployment": {"model": "deepseek-v3", "hardware": "h200", "gpus": 16,
                       "aggregated": {"instances": 1, "dep": dep}},
        "workload": {"arrival": {"kind": "closed", "concurrency": 8}, "requests": 16},
        "slo": {"ttft_p90_ms": 2000.0},
        "predicted": {"gpus": dep, "throughput_tok_s_gpu": throughput,
                      "ttft_ms": {"p90": 900.0}, "tpot_ms": {"p90": 30.0}},
    }))
    return str(path)


def test_compare_puts_plans_side_by_side_and_marks_what_differs(tmp_path):
    a, b = _plan_file(tmp_path / "a.yaml", 8, 1000.0), _plan_file(tmp_path / "b.yaml", 16, 900.0)
    r = run_cli("compare", a, b, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["rows"]["tok/s per GPU"] == [1000.0, 900.0]
    assert set(got["differences"]) == {"GPUs used", "deployment", "tok/s per GPU"}
    table = run_cli("compare", a, b)
    assert table.returncode == 0 and "* deployment" in table.stdout


def test_compare_refuses_what_is_not_a_plan(tmp_path):
    assert_one_line_error(run_cli("compare", "examples/deepseek-v3-h200-pd.yaml"),
                          "deepseek-v3-h200-pd.yaml", "not a plan.yaml")


@pytest.mark.parametrize("args, needle", [
    (("search", "--out", "/proc/x/plan.yaml"), "--out '/proc/x/plan.yaml': cannot write in"),
    (("search", "--storage", "sqlite:////proc/s.db"), "--storage '/proc/s.db': cannot write"),
    (("validate", "--out", "/proc/v.csv"), "--out '/proc/v.csv': cannot write in"),
    (("calibrate", "--device", "cpu", "--out", "/proc/cal"), "--out '/proc/cal': cannot write"),
])
def test_outputs_are_checked_before_the_work(args, needle):
    assert_one_line_error(run_cli(*args), needle)


def test_session_turns_and_trace_rows_past_the_context_are_refused_with_the_count(tmp_path):
    """AgentX's synthetic corpus reaches 990K-token prompts: on a 160K-context model 42 % of
    its turns could never be served, so the run is refused (named, counted, with the cap that
    would fit), and a trace row past the context likewise."""
    sessions = write(tmp_path, {"arrival": {"kind": "sessions", "concurrency": 8},
                                "requests": 20}, "w.yaml")
    assert_one_line_error(run_cli("simulate", "examples/deepseek-v3-h200-pd.yaml",
                                  "--workload", str(sessions)),
                          "of 92,623 session turns", "deepseek-v3's context of 163,840",
                          "shape: {max_input: N}")
    capped = write(tmp_path, {"arrival": {"kind": "sessions", "concurrency": 2,
                                          "shape": {"max_input": 150_000}},
                              "requests": 4}, "capped.yaml")
    assert run_cli("simulate", "examples/deepseek-v3-h200-pd.yaml", "--workload",
                   str(capped), "--json").returncode == 0
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_length,output_length\n0,1000,100\n5,170000,10\n")
    rows = write(tmp_path, {"arrival": {"kind": "trace", "path": str(trace)},
                            "requests": 2}, "trace.yaml")
    assert_one_line_error(run_cli("simulate", "examples/deepseek-v3-h200-pd.yaml",
                                  "--workload", str(rows)),
                          "1 of 2 trace rows (50.0%)", "170,010", f"rows of {trace}")
