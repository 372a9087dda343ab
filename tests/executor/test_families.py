"""executor/families: the per-architecture flags of `vllm serve`, and the precisions refused
where vLLM has no flag for them (one sentence naming the value and what is valid)."""

import json

import pytest

from executor.families import FAMILIES, GENERIC, family_for
from executor.render import render
from simulator.specs.deployment import Deployment, Precision, RoleSpec, Speculative
from simulator.specs.errors import SpecError
from simulator.specs.model import load_model


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def v4(hardware: str = "gb300", weights: str = "fp4", kv: str = "fp8", indexer: str = "fp8",
       **role: object) -> Deployment:
    return Deployment(model="deepseek-v4-flash", hardware=hardware,
                      precision=Precision(weights=weights, kv_cache=kv, indexer_cache=indexer),
                      aggregated=RoleSpec(dep=8, **role))


def head(d: Deployment) -> tuple[str, ...]:
    return render(d).processes[0].argv


def test_the_table_is_keyed_by_the_models_architecture():
    assert family_for(load_model("deepseek-v4-flash").architecture) is FAMILIES[
        "DeepseekV4ForCausalLM"]
    assert family_for(load_model("deepseek-v4-pro").architecture) is FAMILIES[
        "DeepseekV4ForCausalLM"]
    assert family_for(load_model("deepseek-v3").architecture) is GENERIC
    assert family_for(None) is GENERIC


def test_v4_on_blackwell_with_fp4_experts_takes_megamoe_instead_of_an_all2all_backend():
    argv = head(v4(speculative=Speculative(tokens=2)))
    assert flag(argv, "--moe-backend") == "deep_gemm_mega_moe"
    assert "--all2all-backend" not in argv
    assert json.loads(flag(argv, "--speculative-config") or "") == {
        "method": "mtp", "num_speculative_tokens": 2}
    assert "--attention-config" not in argv  # fp8 indexer cache is vLLM's default


@pytest.mark.parametrize("d", [
    v4(weights="fp8"),  # MegaMoE runs fp4 experts only
    v4(hardware="h200"),  # and on SM100 only
    v4(all2all_backend="flashinfer_all2allv"),  # a chosen all2all picks the fused-MoE path
], ids=["fp8-experts", "hopper", "chosen-all2all"])
def test_v4_without_megamoe_renders_the_roles_all2all_backend(d):
    argv = head(d)
    assert "--moe-backend" not in argv
    assert flag(argv, "--all2all-backend") == d.aggregated.backend("aggregated")
    assert flag(argv, "--block-size") == "256" and flag(argv, "--kv-cache-dtype") == "fp8"


def test_other_families_get_none_of_v4s_flags():
    argv = head(Deployment(model="deepseek-v3", hardware="gb300",
                           precision=Precision(weights="fp4"), aggregated=RoleSpec(dep=8)))
    for name in ("--moe-backend", "--block-size", "--tokenizer-mode", "--attention-config",
                 "--no-disable-hybrid-kv-cache-manager"):
        assert name not in argv
    assert flag(argv, "--all2all-backend") == "allgather_reducescatter"


@pytest.mark.parametrize(("kv", "hardware", "want"), [
    ("bf16", "h200", "bfloat16"),  # "auto" would be V3.2's own default, not bf16
    ("fp8", "h200", "fp8"),
    ("fp4", "b200", "nvfp4_ds_mla"),
])
def test_deepseek_v32_kv_cache_dtypes(kv, hardware, want):
    d = Deployment(model="deepseek-v3.2", hardware=hardware,
                   precision=Precision(kv_cache=kv, indexer_cache="fp4" if hardware == "b200"
                                       else "fp8"),
                   aggregated=RoleSpec(dep=8))
    argv = head(d)
    assert flag(argv, "--kv-cache-dtype") == want
    assert ("--attention-config" in argv) == (hardware == "b200")


@pytest.mark.parametrize(("d", "message"), [
    (v4(kv="fp4"),
     "precision.kv_cache='fp4' has no vLLM KV-cache dtype for deepseek-v4-flash "
     "(DeepseekV4ForCausalLM): vLLM's DeepSeek-V4 sparse-MLA attention (FlashMLA, its default) "
     "keeps the KV cache in fp8 only and no DeepSeek-V4 backend has an fp4 one; use kv_cache "
     "fp8"),
    (v4(kv="bf16"), "precision.kv_cache='bf16' has no vLLM KV-cache dtype for "
                    "deepseek-v4-flash (DeepseekV4ForCausalLM)"),
    (v4(hardware="h200", indexer="fp4"),
     "precision.indexer_cache='fp4' (vLLM indexer_kv_dtype mxfp4) needs Blackwell datacenter "
     "GPUs (b200, b300, gb200, gb300), not h200; use indexer_cache fp8"),
    (Deployment(model="deepseek-v3", hardware="gb300", precision=Precision(indexer_cache="fp4"),
                aggregated=RoleSpec(dep=8)),
     "precision.indexer_cache='fp4' needs a model with a sparse-attention indexer "
     "(DeepseekV32ForCausalLM, DeepseekV4ForCausalLM, DeepseekV41ForCausalLM), but "
     "deepseek-v3 is DeepseekV3ForCausalLM; use indexer_cache fp8"),
    (Deployment(model="deepseek-v3", hardware="gb300", precision=Precision(kv_cache="fp4"),
                aggregated=RoleSpec(dep=8)),
     "precision.kv_cache='fp4' has no vLLM KV-cache dtype for deepseek-v3 "
     "(DeepseekV3ForCausalLM): rackplan renders an fp4 KV cache only for "
     "DeepseekV32ForCausalLM (vLLM's nvfp4_ds_mla); use kv_cache bf16 or fp8"),
    (Deployment(model="deepseek-v3.2", hardware="h200", precision=Precision(kv_cache="fp4"),
                aggregated=RoleSpec(dep=8)),
     "precision.kv_cache='fp4' (vLLM nvfp4_ds_mla) needs Blackwell datacenter GPUs (b200, "
     "b300, gb200, gb300), not h200; use kv_cache fp8"),
], ids=["v4-fp4-kv", "v4-bf16-kv", "v4-fp4-indexer-on-hopper", "indexer-on-v3", "fp4-kv-on-v3",
        "v32-fp4-kv-on-hopper"])
def test_precisions_vllm_has_no_flag_for_are_refused_in_one_sentence(d, message):
    with pytest.raises(SpecError) as e:
        render(d)
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)
