"""executor/vllm_args: every refused flag reported once, and the golden GPU P/D rendering
parsed by vLLM's own parser in the engine environment (skipped where that is absent)."""

import argparse
import shlex
import sys
from pathlib import Path

import pytest

from executor import vllm_args
from executor.vllm_args import FlagError, check_with_vllm, engine_python, flag_errors
from tests.executor.cluster import pd_rendering

GOLDEN = Path(__file__).parent / "golden" / "deepseek-v3-h200-pd.txt"
V4_GOLDEN = Path(__file__).parent / "golden" / "deepseek-v4-flash-gb300-pd.txt"
V41_GOLDEN = Path(__file__).parent / "golden" / "deepseek-v4.1-flash-gb300-pd.txt"
MODES = {"NONE": 0, "FULL": 1}


class Parser(argparse.ArgumentParser):
    """A parser shaped like vLLM's: errors raised, and a type function whose KeyError
    escapes argparse (as vLLM's compilation-config parsing does)."""

    def error(self, message):
        raise vllm_args._ParserError(message)


def small_parser() -> Parser:
    p = Parser()
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--enable-expert-parallel", action="store_true")
    p.add_argument("--headless", action="store_true")
    p.add_argument("--all2all-backend", choices=["naive", "deepep_low_latency"])
    p.add_argument("--tensor-parallel-size", "-tp", type=int)
    p.add_argument("--compilation-config", type=lambda v: MODES[v])
    return p


def test_each_refused_flag_is_reported_once_in_command_line_order():
    args = ["/m", "--max-num-seqs", "x", "--enable-expert-paralel", "--all2all-backend", "nope",
            "--compilation-config", "WRONG", "-tp", "zz", "--foo", "3", "--headless"]
    assert flag_errors(small_parser(), args) == [
        ("--max-num-seqs", "invalid int value: 'x'"),
        ("--enable-expert-paralel",
         "not an option of vllm serve; did you mean --enable-expert-parallel?"),
        ("--all2all-backend",
         "invalid choice: 'nope' (choose from 'naive', 'deepep_low_latency')"),
        ("--compilation-config", "KeyError: 'WRONG'"),  # raised past argparse, like vLLM's
        ("--tensor-parallel-size", "invalid int value: 'zz'"),
        ("--foo", "not an option of vllm serve"),
    ]


def test_clean_flags_give_no_error():
    assert flag_errors(small_parser(), ["/m", "--max-num-seqs", "4", "-tp", "2",
                                        "--headless"]) == []


def test_one_line_drops_pydantic_s_links():
    text = ("1 validation error for KVTransferConfig\nkv_role\n  Input should be 'kv_producer'\n"
            "    For further information visit https://errors.pydantic.dev/2/v/literal_error")
    assert vllm_args.one_line(text) == ("1 validation error for KVTransferConfig kv_role "
                                        "Input should be 'kv_producer'")


def test_without_the_engine_environment_the_check_is_skipped_with_a_note(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(vllm_args, "_ROOT", tmp_path)
    assert engine_python() is None
    result = check_with_vllm([("decode-0 host 0", ["vllm", "serve", "/m"])])
    assert result.errors == () and result.skipped == (
        "no engine environment at .venv-engine/ (build it with executor/engine_env.sh); "
        "vLLM's own flag check skipped")


def test_an_interpreter_without_vllm_runs_the_script_and_reports_a_skip():
    result = check_with_vllm([("decode-0 host 0", ["vllm", "serve", "/m"])],
                             python=Path(sys.executable))
    assert result.errors == ()
    assert result.skipped is not None
    assert result.skipped.startswith("vLLM is not importable here (ModuleNotFoundError")


def golden_processes(path: Path) -> list[tuple[str, list[str]]]:
    """Each line of a golden file as (name, argv), the environment assignments dropped."""
    processes = []
    for n, line in enumerate(path.read_text().splitlines()):
        words = shlex.split(line)
        while "=" in words[0] and not words[0].startswith("-"):  # VAR=value before the command
            words.pop(0)
        processes.append((f"golden line {n + 1}", words))
    return processes


@pytest.mark.skipif(engine_python() is None, reason="no engine environment (.venv-engine)")
def test_vllm_s_own_parser_accepts_the_golden_pd_rendering_and_refuses_bad_flags():
    processes = golden_processes(GOLDEN)
    assert len(processes) == len(pd_rendering().processes)
    head = processes[0][1]
    bad = [*head[:3], "--max-num-seqs", "lots", "--enable-expert-paralel",
           "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"both"}',
           *head[3:]]
    result = check_with_vllm([*processes, ("broken host 0", bad)])
    assert result.skipped is None, result.skipped
    assert result.vllm_version is not None and result.vllm_version.startswith("0.32")
    assert [e for e in result.errors if e.process != "broken host 0"] == []
    got = [(e.flag, e.message) for e in result.errors]
    assert [flag for flag, _ in got] == ["--max-num-seqs", "--enable-expert-paralel",
                                         "--kv-transfer-config"]
    assert got[0][1] == "invalid int value: 'lots'"
    assert "did you mean --enable-expert-parallel?" in got[1][1]
    assert "kv_role" in got[2][1] and "\n" not in got[2][1]
    assert str(result.errors[0]) == "broken host 0: --max-num-seqs: invalid int value: 'lots'"
    assert isinstance(result.errors[0], FlagError)


@pytest.mark.skipif(engine_python() is None, reason="no engine environment (.venv-engine)")
def test_vllm_s_own_parser_accepts_the_deepseek_v4_golden_rendering():
    """Block size, tokenizer mode, indexer_kv_dtype, MegaMoE and the hybrid KV-cache switch
    are all vLLM 0.32 flags; the older recipes' use_fp4_indexer_cache is not."""
    processes = golden_processes(V4_GOLDEN)
    head = processes[0][1]
    old = [*head[:3], "--attention-config", '{"use_fp4_indexer_cache":true}', *head[3:]]
    result = check_with_vllm([*processes, ("old recipe host 0", old)])
    assert result.skipped is None, result.skipped
    assert [e for e in result.errors if e.process != "old recipe host 0"] == []
    ((flag, message),) = [(e.flag, e.message) for e in result.errors]
    assert flag == "--attention-config" and "use_fp4_indexer_cache" in message


@pytest.mark.skipif(engine_python() is None, reason="no engine environment (.venv-engine)")
def test_vllm_s_own_parser_accepts_the_deepseek_v41_golden_rendering():
    """nvfp4_ds_mla, the deepseek_v41 tokenizer mode and the dspark speculative method pass
    vLLM 0.32's own parser; a KV-cache dtype it has no name for is refused."""
    processes = golden_processes(V41_GOLDEN)
    head = processes[-1][1]
    bad = [*head[:3], "--kv-cache-dtype", "fp4_ds_mla", *head[3:]]
    result = check_with_vllm([*processes, ("bad kv host", bad)])
    assert result.skipped is None, result.skipped
    assert [e for e in result.errors if e.process != "bad kv host"] == []
    ((flag, _),) = [(e.flag, e.message) for e in result.errors]
    assert flag == "--kv-cache-dtype"


@pytest.mark.skipif(engine_python() is None, reason="no engine environment (.venv-engine)")
def test_vllm_s_own_parser_accepts_dual_batch_overlap():
    from executor.render import render
    from simulator.specs.deployment import Deployment, RoleSpec
    d = Deployment(model="deepseek-v3", hardware="h200",
                   prefill=RoleSpec(dep=16, dbo=True, prefix_caching=False),
                   decode=RoleSpec(dep=16, dbo=True))
    processes = [(f"{p.instance} host {p.host}", list(p.argv)) for p in render(d).processes]
    result = check_with_vllm(processes)
    assert result.skipped is None, result.skipped
    assert not result.errors


@pytest.mark.skipif(engine_python() is None, reason="no engine environment (.venv-engine)")
def test_vllm_s_own_parser_accepts_attention_dp_over_tp_groups_and_offload():
    from executor.render import render
    from simulator.specs.deployment import Deployment, RoleSpec
    d = Deployment(model="deepseek-v3", hardware="h200",
                   aggregated=RoleSpec(dep=4, tp=4, cpu_offload_gb=8, host_cache_gb=64))
    prefetch = Deployment(model="deepseek-r1", hardware="gb200", precision={"weights": "fp4"},
                          prefill=RoleSpec(dep=2, cpu_offload_gb=32, offload_backend="prefetch"),
                          decode=RoleSpec(dep=8))
    processes = [(f"{p.instance} host {p.host}", list(p.argv))
                 for p in (*render(d).processes, *render(prefetch).processes)]
    result = check_with_vllm(processes)
    assert result.skipped is None, result.skipped
    assert not result.errors
