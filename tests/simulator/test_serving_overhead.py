"""Serving latencies measured on one's own engine, kept in a calibration folder, win over the
shipped fit while that folder is the active calibration — for simulate, step and plans alike."""

import json

import pytest
import yaml

from planner.cli import main
from planner.evaluate import measured_overhead, overhead_for, sim_options
from simulator.calibration.serving import (
    USER_FILE,
    ServingOverhead,
    serving_overhead,
    user_serving_overhead,
    write_user_serving_overhead,
)
from simulator.calibration.tables import calibration_dir
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_deployment

ABOUT = {"fitted": "2026-11-29", "command": "test"}
AGG = {"model": "tiny-moe", "hardware": "cpu", "precision": {"weights": "bf16",
                                                              "kv_cache": "bf16"},
       "aggregated": {"instances": 1, "max_num_seqs": 8, "max_num_batched_tokens": 512}}
PD = {**{k: v for k, v in AGG.items() if k != "aggregated"},
      "prefill": {"instances": 1, "max_num_seqs": 8, "max_num_batched_tokens": 512},
      "decode": {"instances": 1, "max_num_seqs": 8, "max_num_batched_tokens": 512}}


@pytest.fixture
def folder(tmp_path):
    """A calibration folder holding measured CPU latencies for vLLM (no tables needed)."""
    write_user_serving_overhead(tmp_path, "cpu", "vllm",
                                {"step_overhead_ms": 1.5, "api_overhead_ms": 20.0,
                                 "handoff_ms": 40.0}, ABOUT)
    return tmp_path


def test_measured_latencies_round_trip_and_only_pd_pays_the_handoff(folder):
    agg = user_serving_overhead(folder, "cpu", "vllm", False)
    pd_ = user_serving_overhead(folder, "cpu", "vllm", True)
    assert agg is not None and pd_ is not None
    assert (agg.step_overhead_ms, agg.api_overhead_ms, agg.handoff_ms) == (1.5, 20.0, 0.0)
    assert pd_.handoff_ms == 40.0
    data = json.loads((folder / USER_FILE).read_text())
    assert data["hardware"]["cpu"]["vllm"]["command"] == "test"


def test_other_hardware_or_engine_is_not_covered(folder, tmp_path_factory):
    assert user_serving_overhead(folder, "h200", "vllm", False) is None
    assert user_serving_overhead(folder, "cpu", "sglang", False) is None
    assert user_serving_overhead(tmp_path_factory.mktemp("empty"), "cpu", "vllm", False) is None


def test_an_update_keeps_other_entries_and_none_removes_a_latency(folder):
    write_user_serving_overhead(folder, "h200", "vllm", {"api_overhead_ms": 5.0}, ABOUT)
    write_user_serving_overhead(folder, "cpu", "vllm",
                                {"step_overhead_ms": 2.0, "handoff_ms": None}, ABOUT)
    cpu = user_serving_overhead(folder, "cpu", "vllm", True,
                                fallback=serving_overhead("vllm", True))
    assert cpu is not None
    assert (cpu.step_overhead_ms, cpu.api_overhead_ms) == (2.0, 20.0)
    assert cpu.handoff_ms == serving_overhead("vllm", True).handoff_ms  # left out: shipped
    h200 = user_serving_overhead(folder, "h200", "vllm", False)
    assert h200 is not None and h200.api_overhead_ms == 5.0 and h200.step_overhead_ms is None
    assert not list(folder.glob(".*.tmp"))


def test_a_measured_api_overhead_comes_without_the_shipped_time_per_prompt_token(folder):
    """An API overhead measured on one's own engine holds its prompt's share already; a folder
    that measured none keeps the shipped fit's fixed part and its part per prompt token."""
    shipped = ServingOverhead(api_overhead_ms=50.0, api_per_ktoken_ms=10.0)
    own = user_serving_overhead(folder, "cpu", "vllm", False, fallback=shipped)
    assert own is not None and (own.api_overhead_ms, own.api_per_ktoken_ms) == (20.0, 0.0)
    assert own.api_ms(2000) == 20.0
    write_user_serving_overhead(folder, "h200", "vllm", {"step_overhead_ms": 2.0}, ABOUT)
    step_only = user_serving_overhead(folder, "h200", "vllm", False, fallback=shipped)
    assert step_only is not None and step_only.api_ms(2000) == 70.0
    write_user_serving_overhead(folder, "cpu", "vllm", {"api_per_ktoken_ms": 3.0}, ABOUT)
    both = user_serving_overhead(folder, "cpu", "vllm", False, fallback=shipped)
    assert both is not None and both.api_ms(2000) == 26.0


def test_bad_latency_name_bad_folder_and_bad_file_are_one_sentence(folder, tmp_path):
    with pytest.raises(SpecError, match="unknown serving latency 'queue_ms'"):
        write_user_serving_overhead(folder, "cpu", "vllm", {"queue_ms": 1.0}, ABOUT)
    with pytest.raises(SpecError, match="is not a folder"):
        write_user_serving_overhead(tmp_path / "nope", "cpu", "vllm", {}, ABOUT)
    (folder / USER_FILE).write_text("{not json")
    with pytest.raises(SpecError, match="is not readable JSON") as e:
        user_serving_overhead(folder, "cpu", "vllm", False)
    assert "\n" not in str(e.value)
    (folder / USER_FILE).write_text(json.dumps({"format": 99}))
    with pytest.raises(SpecError, match="has format 99, expected 1"):
        user_serving_overhead(folder, "cpu", "vllm", False)


def test_the_active_calibration_folder_sets_what_simulate_applies(folder):
    agg, pd_ = load_deployment(AGG), load_deployment(PD)
    assert measured_overhead(agg) is None
    assert overhead_for(agg) == serving_overhead("vllm", False, "cpu", "gqa")  # tiny-moe's
    with calibration_dir(folder):
        assert overhead_for(agg).api_overhead_ms == 20.0
        assert overhead_for(pd_).handoff_ms == 40.0
        assert sim_options(agg).step_overhead_ms == 1.5
        h200 = load_deployment({**AGG, "model": "deepseek-v3", "hardware": "h200",
                                "precision": {"weights": "fp8", "kv_cache": "fp8"},
                                "aggregated": {"dep": 8}})
        assert overhead_for(h200) == serving_overhead("vllm", False, "h200", "mla")  # cpu only


def test_simulate_and_step_take_the_measured_latencies(folder, tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"format": 1, "deployment": AGG, "workload": {
        "arrival": {"kind": "closed", "concurrency": 1}, "requests": 2,
        "input_tokens": {"kind": "fixed", "value": 64},
        "output_tokens": {"kind": "fixed", "value": 8}}}))
    assert main(["simulate", str(plan), "--json", "--calibration", str(folder)]) == 0
    measured = json.loads(capsys.readouterr().out)
    write_user_serving_overhead(folder, "cpu", "vllm", {"api_overhead_ms": 120.0}, ABOUT)
    assert main(["simulate", str(plan), "--json", "--calibration", str(folder)]) == 0
    slower = json.loads(capsys.readouterr().out)
    assert slower["ttft_ms"]["p50"] == pytest.approx(measured["ttft_ms"]["p50"] + 100.0)
    assert slower["tpot_ms"]["p50"] == pytest.approx(measured["tpot_ms"]["p50"])

    dep = tmp_path / "d.yaml"
    dep.write_text(yaml.safe_dump(AGG))
    args = ["step", str(dep), "--role", "aggregated", "--batch", "2", "--context", "64",
            "--json"]
    assert main([*args, "--calibration", str(folder)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["parts_ms"]["overhead"] == 1.5
    assert report["provenance"]["overhead"] == "measured (fixed)"
    assert main(args) == 0
    assert "assumed fixed" in json.loads(capsys.readouterr().out)["provenance"]["overhead"]


def test_a_pd_measurement_is_what_pd_plans_read_and_aggregated_ones_do_not(folder):
    """On a small host a P/D deployment's steps cost more than an aggregated one's (the decode
    engine's API server shares its core): its own fit lives in the entry's P/D part."""
    write_user_serving_overhead(folder, "cpu", "vllm",
                                {"step_overhead_ms": 3.0, "step_overhead_per_seq_ms": 0.25,
                                 "handoff_ms": 12.0}, ABOUT, disaggregated=True)
    agg = user_serving_overhead(folder, "cpu", "vllm", False)
    pd_ = user_serving_overhead(folder, "cpu", "vllm", True)
    assert agg is not None and pd_ is not None
    assert (agg.step_overhead_ms, agg.step_overhead_per_seq_ms, agg.handoff_ms) == (1.5, 0.0, 0.0)
    assert (pd_.step_overhead_ms, pd_.step_overhead_per_seq_ms, pd_.handoff_ms) == (3.0, 0.25,
                                                                                     12.0)
    assert pd_.api_overhead_ms == 20.0  # left out of the P/D part: the aggregated fit's
    entry = json.loads((folder / USER_FILE).read_text())["hardware"]["cpu"]["vllm"]
    assert entry["handoff_ms"] == 40.0 and entry["disaggregated"]["handoff_ms"] == 12.0


def test_a_step_pays_the_measured_cost_of_each_request_it_runs(folder, tmp_path, capsys):
    write_user_serving_overhead(folder, "cpu", "vllm", {"step_overhead_per_seq_ms": 0.5},
                                ABOUT)
    dep = tmp_path / "d.yaml"
    dep.write_text(yaml.safe_dump(AGG))
    parts = {}
    for batch in (1, 4):
        assert main(["step", str(dep), "--role", "aggregated", "--batch", str(batch),
                     "--context", "64", "--json", "--calibration", str(folder)]) == 0
        report = json.loads(capsys.readouterr().out)
        parts[batch] = report["parts_ms"]["request_overhead"]
        assert report["parts_ms"]["overhead"] == 1.5
        assert report["provenance"]["request_overhead"].startswith("measured (0.5 ms per")
    assert parts == {1: 0.5, 4: 2.0}


def test_requests_arriving_together_share_the_api_server():
    """The serial part of the API overhead is the API server's own work, its time shared among
    the requests it holds: four users who arrive together reach the scheduler together, four
    serial times after they came (three more than a lone user), and take their first tokens in
    one prefill step; a lone user sees the same overhead either way. (The engine plans each
    step when the one before it ends here.)"""
    from simulator.des import SimOptions, simulate
    from simulator.specs.loading import load_workload

    dep = load_deployment(AGG)

    def ttfts(users: int, serial: float) -> list[float]:
        w = load_workload({"arrival": {"kind": "closed", "concurrency": users},
                           "requests": users, "input_tokens": {"kind": "fixed", "value": 64},
                           "output_tokens": {"kind": "fixed", "value": 4}})
        res = simulate(dep, w, options=SimOptions(api_overhead_ms=20.0, api_serial_ms=serial,
                                                  schedule_ahead=False))
        return sorted(float(t) * 1e3 for t in res.ttft_s)

    assert ttfts(1, 8.0) == pytest.approx(ttfts(1, 0.0))
    apart = ttfts(4, 0.0)
    assert max(apart) - min(apart) < 1.0  # one prefill step for all four
    shared = ttfts(4, 8.0)
    assert max(shared) - min(shared) < 1.0  # still one step: they left the server together
    assert shared[0] - apart[0] == pytest.approx(3 * 8.0, abs=0.01)


def test_a_request_arriving_at_a_busy_api_server_slows_the_one_in_service():
    """Processor sharing: 8 ms of work arriving at 0 and at 4 ms: the first has 4 ms left when
    the second comes, both then get half the server, so the first is done at 12 ms and the
    second at 16; three arriving together are all done at 3 x their work."""
    import simpy

    from simulator.des.apiserver import SharedServer

    env = simpy.Environment()
    server = SharedServer(env)
    done: dict[str, float] = {}

    def arrive(name: str, at: float, work: float) -> None:
        env.timeout(at).callbacks.append(lambda _: server.take(
            work, lambda: done.setdefault(name, env.now)))

    arrive("a", 0.0, 8e-3)
    arrive("b", 4e-3, 8e-3)
    for name in ("c", "d", "e"):
        arrive(name, 1.0, 2e-3)
    env.run()
    assert done["a"] == pytest.approx(12e-3) and done["b"] == pytest.approx(16e-3)
    assert [done[n] for n in "cde"] == pytest.approx([1.006] * 3)
    assert server.busy == 0


def test_a_pd_request_passes_the_decode_instances_api_server_too():
    """The proxy sends a prefilled request on to the decode engine's own API server, which
    takes it in anew: its serial part is paid there as well (a lone user pays the overhead's
    pure delay once and its serial part at both servers)."""
    from simulator.des import SimOptions, simulate
    from simulator.specs.loading import load_workload

    dep = load_deployment(PD)
    w = load_workload({"arrival": {"kind": "closed", "concurrency": 1}, "requests": 2,
                       "input_tokens": {"kind": "fixed", "value": 64},
                       "output_tokens": {"kind": "fixed", "value": 4}})

    def ttft(serial: float) -> float:
        res = simulate(dep, w, options=SimOptions(api_overhead_ms=8.0, api_serial_ms=serial))
        return float(res.ttft_s[0]) * 1e3

    assert ttft(8.0) - ttft(0.0) == pytest.approx(8.0, abs=0.01)
    assert ttft(3.0) - ttft(0.0) == pytest.approx(3.0, abs=0.01)


def test_the_serial_part_is_fitted_where_requests_arrive_together():
    from kernels.from_run import fit_api_serial

    def simulate(o):  # four together: the median waits 1.5 serial times
        return {"ttft_ms": {"p50": 5.0 + o.api_overhead_ms + 1.5 * o.api_serial_ms}}

    base = ServingOverhead(api_overhead_ms=10.0)
    assert fit_api_serial(27.0, simulate, base) == pytest.approx(8.0, abs=1e-3)
    assert fit_api_serial(12.0, simulate, base) == 0.0  # a pure delay already over-predicts
    assert fit_api_serial(99.0, simulate, base) == 10.0  # all of it serial, and no more


def test_the_fixed_api_overhead_fitted_on_a_system_s_own_rows_is_that_hardware_s(monkeypatch):
    """Hosts differ between the measured systems: a hardware preset with its own fixed API
    overhead gets it; the others, and the part per prompt token, stay the engine's."""
    import simulator.calibration.serving as serving

    table = {"engines": {"vllm": {"api_overhead_ms": 20.0, "api_per_ktoken_ms": 10.0,
                                  "step_overhead_ms": 1.5, "handoff_ms": 90.0,
                                  serving.HARDWARE_KEY: {"h200": {"api_overhead_ms": 35.0}}}}}
    monkeypatch.setattr(serving, "_table", lambda: table)
    h200 = serving_overhead("vllm", True, "h200")
    assert (h200.api_overhead_ms, h200.api_per_ktoken_ms, h200.handoff_ms) == (35.0, 10.0, 90.0)
    assert serving_overhead("vllm", False, "b200").api_overhead_ms == 20.0
    assert serving_overhead("vllm", False).api_ms(1000) == 30.0


def test_a_step_pays_the_fitted_overhead_of_each_decoder_layer():
    """The shipped fit prices a step's overhead per decoder layer (the small kernels no table
    measures): a model of L layers pays fixed + per-layer x L, and says so."""
    from simulator.calibration.tables import load_calibration
    from simulator.cost import Batch, step_time
    from simulator.cost.step import instance_from_role
    from simulator.specs.hardware import load_hardware
    from simulator.specs.model import load_model

    role = load_deployment(AGG).roles["aggregated"]
    model, cpu = load_model("tiny-moe"), load_hardware("cpu")
    cal = load_calibration(cpu)

    def step(**over):
        inst = instance_from_role(model, cpu, "aggregated", role, "bf16", "bf16", **over)
        return step_time(inst, Batch.decode(inst.dp, 2, 64), cal), inst

    base, _ = step(overhead_ms=0.5)
    layered, inst = step(overhead_ms=0.5, overhead_per_layer_ms=0.25)
    assert layered.total_ms == pytest.approx(base.total_ms + 0.25 * model.layers)
    assert layered.parts["overhead"] == pytest.approx(0.5 + 0.25 * model.layers)
    assert layered.provenance["overhead"] == (
        f"measured (0.5 ms + 0.25 ms per decoder layer x {model.layers})")
    assert inst.step_overhead_ms == pytest.approx(0.5 + 0.25 * model.layers)


def test_a_measured_step_overhead_comes_without_the_shipped_part_per_layer(folder):
    """A step overhead measured on one's own engine holds its model's layers already; a folder
    that measured none keeps the shipped fixed and per-layer parts."""
    shipped = ServingOverhead(step_overhead_ms=0.0, step_overhead_per_layer_ms=0.03)
    own = user_serving_overhead(folder, "cpu", "vllm", False, fallback=shipped)
    assert own is not None
    assert (own.step_overhead_ms, own.step_overhead_per_layer_ms) == (1.5, 0.0)
    write_user_serving_overhead(folder, "h200", "vllm", {"api_overhead_ms": 9.0}, ABOUT)
    api_only = user_serving_overhead(folder, "h200", "vllm", False, fallback=shipped)
    assert api_only is not None
    assert (api_only.step_overhead_ms, api_only.step_overhead_per_layer_ms) == (0.0, 0.03)
    write_user_serving_overhead(folder, "cpu", "vllm", {"step_overhead_per_layer_ms": 0.01},
                                ABOUT)
    both = user_serving_overhead(folder, "cpu", "vllm", False, fallback=shipped)
    assert both is not None
    assert (both.step_overhead_ms, both.step_overhead_per_layer_ms) == (1.5, 0.01)


def test_a_model_s_layers_take_the_step_overhead_fitted_on_their_kind(monkeypatch):
    """Layers of different kinds launch different small kernels: a model whose layer signature
    has a fit of its own pays that per layer, any other the engine's."""
    import simulator.calibration.serving as serving
    from simulator.specs.model import load_model

    table = {"engines": {"sglang": {"step_overhead_ms": 0.0, "step_overhead_per_layer_ms": 0.05,
                                    serving.LAYERS_KEY: {"mla": {
                                        "step_overhead_per_layer_ms": 0.025, "rows": 65}}}}}
    monkeypatch.setattr(serving, "_table", lambda: table)
    assert serving.layer_signature(load_model("deepseek-v3")) == "mla"
    assert serving.layer_signature(load_model("gpt-oss-120b")) == "gqa+swa_gqa"
    mla = serving_overhead("sglang", False, "b200", "mla")
    other = serving_overhead("sglang", False, "b200", "gqa+swa_gqa")
    assert (mla.step_overhead_per_layer_ms, other.step_overhead_per_layer_ms) == (0.025, 0.05)
    assert serving_overhead("sglang", False, "b200").step_overhead_per_layer_ms == 0.05
    assert serving_overhead("sglang", False, "cpu", "mla").step_overhead_per_layer_ms == 0.0


def test_a_model_s_layers_move_the_fixed_api_overhead_by_their_kind_s_offset(monkeypatch):
    """The fixed API overhead (the hardware's where it has one) plus the offset fitted on the
    model's layer signature, floored at 0; the part per prompt token stays the engine's."""
    import simulator.calibration.serving as serving

    table = {"engines": {"trtllm": {
        "api_overhead_ms": 100.0, "api_per_ktoken_ms": 3.0,
        serving.HARDWARE_KEY: {"b200": {"api_overhead_ms": 70.0}},
        serving.LAYERS_KEY: {"mla": {"api_offset_ms": 60.0},
                             "gqa+swa_gqa": {"api_offset_ms": -80.0}}}}}
    monkeypatch.setattr(serving, "_table", lambda: table)
    assert serving_overhead("trtllm", False, "b200", "mla").api_overhead_ms == 130.0
    assert serving_overhead("trtllm", False, "h200", "mla").api_overhead_ms == 160.0
    assert serving_overhead("trtllm", False, "b200", "gqa+swa_gqa").api_overhead_ms == 0.0
    assert serving_overhead("trtllm", False, "b200", "gqa").api_ms(1000) == 73.0


def test_the_shipped_step_overhead_per_request_applies_on_gpus_only(monkeypatch):
    import simulator.calibration.serving as serving

    table = {"engines": {"vllm": {"step_overhead_ms": 0.0, "step_overhead_per_seq_ms": 0.02}}}
    monkeypatch.setattr(serving, "_table", lambda: table)
    assert serving_overhead("vllm", False, "b200").step_overhead_per_seq_ms == 0.02
    assert serving_overhead("vllm", False, "cpu").step_overhead_per_seq_ms == 0.0
    assert serving_overhead("sglang", False, "b200").step_overhead_per_seq_ms == 0.0


def test_the_fit_reads_the_fitting_half_s_loaded_rows_too():
    from simulator.calibration.serving import in_fit_half, used_by_fit

    row = next(f"row-{i}" for i in range(100) if in_fit_half(f"row-{i}"))
    other = next(f"row-{i}" for i in range(100) if not in_fit_half(f"row-{i}"))
    assert used_by_fit(row, "agg", 8) and used_by_fit(row, "agg", 512)
    assert used_by_fit(row, "disagg", 4) and used_by_fit(row, "disagg", 8192)
    assert not used_by_fit(row, "agg", 1024)
    assert not used_by_fit(other, "agg", 4) and not used_by_fit(other, "disagg", 64)


def test_a_pd_plan_takes_the_per_request_step_overhead_of_the_pd_rows(monkeypatch):
    """Where the fit has a slope of its own for P/D rows, a P/D plan's instances take it and an
    aggregated plan keeps the aggregated rows'; an engine without one keeps the aggregated
    slope for both."""
    import simulator.calibration.serving as serving

    table = {"engines": {
        "vllm": {"step_overhead_per_seq_ms": 0.028,
                 serving.DISAGGREGATED: {"step_overhead_per_seq_ms": 0.0, "pairs": 9}},
        "sglang": {"step_overhead_per_seq_ms": 0.024}}}
    monkeypatch.setattr(serving, "_table", lambda: table)
    assert serving_overhead("vllm", False, "gb300").step_overhead_per_seq_ms == 0.028
    assert serving_overhead("vllm", True, "gb300").step_overhead_per_seq_ms == 0.0
    assert serving_overhead("sglang", True, "gb300").step_overhead_per_seq_ms == 0.024
    assert serving_overhead("vllm", True, "cpu").step_overhead_per_seq_ms == 0.0


def test_a_cpu_preset_keeps_the_cost_model_s_step_overhead(monkeypatch):
    """The fitted step parts come from GPU systems' rows; the cpu preset keeps the cost
    model's own per-step overhead until its engine is measured."""
    import simulator.calibration.serving as serving

    table = {"engines": {"vllm": {"api_overhead_ms": 20.0, "step_overhead_ms": 0.0,
                                  "step_overhead_per_layer_ms": 0.03}}}
    monkeypatch.setattr(serving, "_table", lambda: table)
    gpu, cpu = serving_overhead("vllm", False, "h200"), serving_overhead("vllm", False, "cpu")
    assert (gpu.step_overhead_ms, gpu.step_overhead_per_layer_ms) == (0.0, 0.03)
    assert (cpu.step_overhead_ms, cpu.step_overhead_per_layer_ms) == (None, 0.0)
    assert cpu.api_overhead_ms == 20.0


def test_a_burst_of_many_requests_shares_the_api_server_in_one_pass():
    """Ten thousand requests arriving together each take 1/10,000 of the server and finish
    together (each arrival and completion is a heap operation, not a pass over the others);
    a later request finds the server idle again and takes its own work."""
    import simpy

    from simulator.des.apiserver import SharedServer

    env = simpy.Environment()
    server = SharedServer(env)
    done: list[float] = []
    for _ in range(10_000):
        server.take(1e-3, lambda: done.append(env.now))
    env.timeout(20.0).callbacks.append(lambda _: server.take(2e-3, lambda: done.append(env.now)))
    env.run()
    assert len(done) == 10_001 and server.busy == 0
    assert min(done[:-1]) == max(done[:-1]) == pytest.approx(10.0)
    assert done[-1] == pytest.approx(20.002)
