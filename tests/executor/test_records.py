"""executor/records: launch records as data, and their command line as the last step."""

import shlex
import subprocess

import pytest

from executor.records import DataParallel, LaunchRecord, flag_words


def record(**fields: object) -> LaunchRecord:
    base: dict[str, object] = {
        "instance": "decode-0", "role": "decode", "host": 1, "model": "/models/m",
        "flags": (("--max-num-seqs", 64), ("--enable-expert-parallel", None),
                  ("--kv-transfer-config", {"kv_role": "kv_consumer", "kv_connector": "Nixl"})),
        "tp": 2, "dp": DataParallel(size=8, local=4, start_rank=4, address="head",
                                    rpc_port=29550, headless=True)}
    return LaunchRecord(**{**base, **fields})  # type: ignore[arg-type]


def test_values_stay_typed_until_to_argv_writes_them_as_words():
    assert flag_words([("--n", 3), ("--switch", None), ("--cfg", {"b": 1, "a": [1, "x"]})]) == [
        "--n", "3", "--switch", "--cfg", '{"a":[1,"x"],"b":1}']
    assert record().to_argv() == (
        "vllm", "serve", "/models/m", "--max-num-seqs", "64", "--enable-expert-parallel",
        "--kv-transfer-config", '{"kv_connector":"Nixl","kv_role":"kv_consumer"}',
        "--tensor-parallel-size", "2", "--data-parallel-size", "8",
        "--data-parallel-size-local", "4", "--data-parallel-address", "head",
        "--data-parallel-rpc-port", "29550", "--data-parallel-start-rank", "4", "--headless")
    head = record(host=0, tp=1, port=8100, dp=DataParallel(8, 4, 0, "head", 29550))
    assert head.to_argv()[-4:] == ("--data-parallel-rpc-port", "29550", "--port", "8100")
    assert "--data-parallel-start-rank" not in head.to_argv()  # rank 0 on the head: implied
    assert head.gpus == 4 and record().gpus == 8


def test_a_record_answers_by_field_and_by_flag():
    r = record()
    assert r.value("--kv-transfer-config") == {"kv_role": "kv_consumer", "kv_connector": "Nixl"}
    assert r.value("--max-num-seqs") == 64 and r.value("--absent") is None
    assert r.has("--enable-expert-parallel") and not r.has("--enable-eplb")
    assert r.argv == r.to_argv()
    assert shlex.split(record(env={"A": "1 2"}).command_line())[:3] == ["A=1 2", "vllm", "serve"]


def test_shell_words_leave_the_named_data_parallel_fields_to_the_shell():
    words = record().shell_words(executable='"${VLLM:-vllm}"',
                                 dp={"address": "$HEAD", "start_rank": "$((2 * 2))"})
    script = "VLLM=echo; HEAD=h9; " + " ".join(words)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    expected = record(dp=DataParallel(8, 4, 4, "h9", 29550, True))
    assert out.stdout.split() == list(expected.to_argv()[1:])
    with pytest.raises(ValueError, match="no data-parallel field 'rank'"):
        record().shell_words(dp={"rank": "1"})
