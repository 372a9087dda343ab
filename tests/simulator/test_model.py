"""Model specs: presets and real Hugging Face configs load with the published sizes."""

import importlib.util
import json
from importlib import resources
from pathlib import Path

import pytest

from simulator.specs.errors import SpecError
from simulator.specs.model import BUILDERS, PRESET_DIR, load_model, model_from_config, preset_names


def _config_dir() -> Path | None:
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "model_configs"


CONFIGS = _config_dir()

# config file in aiconfigurator-core -> (published total B without MTP, published active B).
# Active figures are quoted without the input embedding (a lookup, not a matmul), as OpenAI
# does for gpt-oss; None where the published figure is the total (dense models).
PUBLISHED = {
    "MiniMaxAI--MiniMax-M2.5_config.json": (229.0, 10.0),
    "moonshotai--Kimi-K2.5_config.json": (1040.0, 32.0),  # text model of Kimi-K2
    "zai-org--GLM-5_config.json": (744.0, 40.0),
    "nvidia--DeepSeek-V3.1-NVFP4_config.json": (671.0, 37.0),
    "Qwen--Qwen3-235B-A22B-FP8_config.json": (235.0, 22.0),
    "openai--gpt-oss-120b_config.json": (116.83, 5.13),
    "Qwen--Qwen3.5-397B-A17B_config.json": (397.0, 17.0),
    "Qwen--Qwen3.5-122B-A10B_config.json": (122.0, None),  # "A10B" counts the embeddings
    "Qwen--Qwen3.5-35B-A3B_config.json": (35.0, 3.0),
    "Qwen--Qwen3-32B_config.json": (32.8, None),
    "meta-llama--Meta-Llama-3.1-70B_config.json": (70.6, None),
    "meta-llama--Meta-Llama-3.1-8B_config.json": (8.03, None),
}


def load_shipped(filename: str):
    """A ModelSpec from a config.json shipped with aiconfigurator-core (skip if absent)."""
    path = CONFIGS / filename if CONFIGS else None
    if path is None or not path.is_file():
        pytest.skip(f"{filename} is not shipped with the installed aiconfigurator-core")
    return load_model(str(path))


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_loads(name):
    m = load_model(name)
    assert m.total_params() >= m.active_params() > 0
    assert m.kv_bytes_per_token("fp8") > 0


@pytest.mark.parametrize("filename", sorted(PUBLISHED))
def test_shipped_config_matches_published_size(filename):
    m = load_shipped(filename)
    total, active = PUBLISHED[filename]
    params = m.params()
    assert (m.total_params() - params["mtp"]) / 1e9 == pytest.approx(total, rel=0.03)
    if active is not None:
        assert (m.active_params() - params["embedding"]) / 1e9 == pytest.approx(active, rel=0.05)


def test_kimi_k25_reads_its_text_config():
    m = load_shipped("moonshotai--Kimi-K2.5_config.json")
    assert m.architecture == "KimiK25ForConditionalGeneration"
    assert (m.attention, m.n_routed_experts, m.top_k, m.layers) == ("mla", 384, 8, 61)


def test_glm5_is_sparse_mla():
    m = load_shipped("zai-org--GLM-5_config.json")
    assert (m.attention, m.sparse_topk, m.index_head_dim, m.index_n_heads) == ("mla", 2048, 128, 32)
    assert m.head_dim == 192 + 64 and m.v_head_dim == 256
    # latent 512 + rope 64 at fp8, plus the fp8 indexer key (128) and its fp32 scale (4)
    assert m.kv_bytes_per_token("fp8") == 78 * (512 + 64 + 128 + 4)
    assert m.attended_context(100_000) == 2048


def test_minimax_m2_is_gqa_moe():
    m = load_shipped("MiniMaxAI--MiniMax-M2.5_config.json")
    assert (m.attention, m.num_kv_heads, m.head_dim) == ("gqa", 8, 128)
    assert (m.n_routed_experts, m.top_k, m.moe_intermediate, m.dense_layers) == (256, 8, 1536, 0)


def test_mla_kv_bytes_per_token():
    m = load_shipped("nvidia--DeepSeek-V3.1-NVFP4_config.json")
    assert m.kv_bytes_per_token("fp8") == 61 * (512 + 64) * 1
    assert load_model("deepseek-v3").kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2


def test_gqa_kv_bytes_per_token():
    m = load_shipped("Qwen--Qwen3-235B-A22B-FP8_config.json")
    assert m.kv_bytes_per_token("fp8") == 94 * 2 * 4 * 128 * 1


def test_sliding_window_layers_stop_growing():
    m = load_shipped("openai--gpt-oss-120b_config.json")
    per_layer = 2 * 8 * 64 * 1
    assert (m.full_attention_layers, m.sliding_layers, m.sliding_window) == (18, 18, 128)
    assert m.kv_bytes_per_token("fp8") == 18 * per_layer
    grown = m.kv_bytes(10_000, "fp8") - m.kv_bytes(1_000, "fp8")
    assert grown == 18 * per_layer * 9_000
    assert m.kv_bytes(64, "fp8") == 36 * per_layer * 64  # inside the window every layer grows


def test_gated_deltanet_layers_keep_a_constant_state():
    m = load_shipped("Qwen--Qwen3.5-35B-A3B_config.json")
    assert dict(m.layer_kinds) == {"gqa": 10, "linear": 30}
    assert m.mtp_layers == 1 and m.attn_output_gate
    # per layer: fp32 state of 32 value heads x 128 x 128, and the bf16 window (kernel 4 - 1)
    # of q, k (16 heads x 128 each) and v (32 x 128)
    state = 32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2
    per_token = 10 * 2 * 2 * 256 * 1  # the full-attention layers' fp8 K and V
    assert m.kv_bytes_per_token("fp8") == per_token
    assert m.kv_bytes(1000, "fp8") == 1000 * per_token + 30 * state
    assert m.kv_bytes(100_000, "fp8") - m.kv_bytes(1000, "fp8") == 99_000 * per_token


def test_unknown_architecture_names_it_and_the_supported_ones():
    with pytest.raises(SpecError) as e:
        model_from_config("x", {"architectures": ["FooForCausalLM"]})
    msg = str(e.value)
    assert "'FooForCausalLM'" in msg
    assert all(arch in msg for arch in BUILDERS)


def test_missing_key_is_named():
    cfg = json.loads(resources.files("simulator.specs").joinpath(
        f"{PRESET_DIR}/deepseek-v3.2.json").read_text())
    del cfg["index_topk"]
    with pytest.raises(SpecError, match="lacks the key 'index_topk'"):
        model_from_config("v32", cfg)
    wrapped = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {}}
    with pytest.raises(SpecError, match=r"lacks the key 'text_config\.num_hidden_layers'"):
        model_from_config("k25", wrapped)


def test_unknown_layer_type_is_refused():
    cfg = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
           "layer_types": ["mamba", "full_attention"]}
    with pytest.raises(SpecError, match="layer types mamba"):
        model_from_config("hybrid", cfg)


def test_hugging_face_ids_resolve_offline(tmp_path, monkeypatch):
    from simulator.specs.model import hf_config

    # an id with a preset of ours loads the preset
    assert load_model("deepseek-ai/DeepSeek-V4-Flash") == load_model("deepseek-v4-flash")
    # an id aiconfigurator-core ships a config.json for
    minimax = load_model("MiniMaxAI/MiniMax-M2.5")
    assert minimax.name == "MiniMaxAI/MiniMax-M2.5" and minimax.is_moe
    # an id in the local Hugging Face cache: the newest snapshot's config.json
    hub = tmp_path / "hub"
    snap = hub / "models--acme--Tiny-MoE" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(
        (Path(__file__).parents[2] / "simulator/specs/presets/models/tiny-moe.json").read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert hf_config("acme/Tiny-MoE") == snap / "config.json"
    load_model.cache_clear()
    assert load_model("acme/Tiny-MoE").name == "acme/Tiny-MoE"
    # an id found nowhere: one line naming where it looked
    with pytest.raises(SpecError, match=r"'acme/Missing'.*Hugging Face cache .*hub"):
        load_model("acme/Missing")
    load_model.cache_clear()


@pytest.mark.parametrize(("preset", "window"), [
    ("deepseek-v3", 163_840),          # max_position_embeddings (the preset has no rope_scaling)
    ("deepseek-v4-flash", 1_048_576),  # YaRN: original_max_position_embeddings 65,536 x 16
    ("gpt-oss-120b", 131_072),
    ("qwen3-235b-a22b", 40_960),
    ("tiny-moe", 2_048),
])
def test_the_context_window_is_the_one_vllm_derives(preset, window):
    assert load_model(preset).context_length == window


def test_a_bad_rope_factor_is_named():
    text = resources.files("simulator.specs").joinpath(f"{PRESET_DIR}/deepseek-v3.json")
    cfg = json.loads(text.read_text())
    cfg["rope_scaling"] = {"type": "yarn", "factor": "forty"}
    with pytest.raises(SpecError, match=r"rope_scaling.factor='forty'; it must be a number"):
        model_from_config("m", cfg)
