"""Megatron-LM launch files of mixture-of-experts plans (issue 14): the MoE and MLA flags pass the argparse
mirror, validate_args' rules and megatron-core 0.16's own TransformerConfig / MLATransformerConfig checks, and
describe the plan's experts and layout."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megatron.core.transformer.enums import LayerType

from autotune.catalog import load_hardware
from autotune.emit.megatron import emit_megatron
from autotune.emit.megatron_moe import moe_layer_pattern
from autotune.search.planner import search
from autotune.search.space import SearchSpace
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan
from .megatron_validate import MegatronArgsError, validate_args, validate_launch
from .test_megatron import _inp, _validate

JOB = JobSpec(global_batch=4096, seq_len=4096)

CASES = {
    # the plan `autotune plan --model deepseek-v3 --gpu h100-sxm --gpus 1024 --global-batch 4096 --seq-len 4096`
    # chose in this session (ZeRO-3 = Megatron FSDP, ep 8)
    "deepseek_v3_planner": ("deepseek-v3", Plan(tp=1, pp=1, dp=1024, ep=8, mbs=4, num_microbatches=1,
                                                recompute="full", recompute_layers=59, zero=3,
                                                layers_per_stage=(61,), bucket_size=10_000_000)),
    "deepseek_v3_pipelined": ("deepseek-v3", Plan(tp=8, pp=8, dp=16, ep=64, etp=1, mbs=1, num_microbatches=256,
                                                  zero=1, sequence_parallel=True, recompute="full", vocab="balanced",
                                                  layers_per_stage=(7, 8, 8, 8, 8, 8, 8, 6))),
    # Megatron-Bridge's (pp 4, vp 2) DeepSeek-V3 shape: uneven chunks need the explicit layout, which must then
    # place the MTP module ("m") before the loss on the last stage
    "deepseek_v3_layout": ("deepseek-v3", Plan(tp=2, pp=4, dp=128, ep=64, etp=1, mbs=1, num_microbatches=32,
                                               zero=1, sequence_parallel=True, recompute="full", vocab="balanced",
                                               schedule="interleaved", vpp=2, layers_per_stage=(16, 16, 16, 13))),
    # Kimi K2 as its Megatron-Bridge recipe runs it (tp 2, pp 16, ep 32, E+4 | 4 x 14 | 1 + loss)
    "kimi_k2_recipe": ("kimi-k2", Plan(tp=2, pp=16, dp=32, ep=32, etp=1, mbs=1, num_microbatches=128, zero=1,
                                       sequence_parallel=True, recompute="selective", vocab="balanced",
                                       layers_per_stage=(4,) * 15 + (1,))),
    # the expert all-to-all overlapped (--overlap-moe-expert-parallel-comm): megatron-core wants a virtual
    # pipeline with pp > 1, no full recompute, and then one MTP layer at most
    "deepseek_v3_ep_overlap": ("deepseek-v3", Plan(tp=2, pp=4, dp=128, ep=64, etp=1, mbs=1, num_microbatches=32,
                                                   zero=1, sequence_parallel=True, vocab="balanced",
                                                   schedule="interleaved", vpp=2, layers_per_stage=(16, 16, 16, 13),
                                                   ep_overlap=True)),
    "qwen3_235b_etp": ("qwen3-235b-a22b", Plan(tp=4, pp=2, dp=128, ep=16, etp=4, mbs=1, num_microbatches=32,
                                               zero=1, sequence_parallel=True, recompute="selective",
                                               layers_per_stage=(47, 47))),
    "mixtral_8x22b": ("mixtral-8x22b", Plan(tp=2, pp=4, dp=128, ep=8, mbs=1, num_microbatches=32, zero=1,
                                            sequence_parallel=True, layers_per_stage=(14, 14, 14, 14))),
    # Llama 4's top-1 sigmoid router without DeepSeek's balancing bias (Megatron-Bridge's Llama4ModelProvider)
    "llama4_scout": ("llama4-scout", Plan(tp=4, pp=2, dp=128, ep=8, etp=1, mbs=1, num_microbatches=32, zero=1,
                                          sequence_parallel=True, layers_per_stage=(24, 24))),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_moe_plans_pass_megatron_validation(case: str, dispatcher: str) -> None:
    model, plan = CASES[case]
    inp = _inp(model, "h100-sxm", replace(JOB, moe_dispatcher=dispatcher), plan)
    _validate(inp)  # parse, validate_args replay, megatron-core configs, layers per chunk
    script = dict(emit_megatron(inp).files)["launch_megatron.sh"]
    _, v = validate_launch(script, tokenizer_vocab=inp.model.vocab_size)
    c, m = v.config, inp.model
    assert (c.num_moe_experts, c.moe_router_topk, c.moe_ffn_hidden_size) == (m.num_experts, m.moe_top_k,
                                                                             m.moe_ffn_hidden_size)
    assert (c.expert_model_parallel_size, c.expert_tensor_parallel_size) == (plan.ep, plan.etp)
    # DeepEP runs through Megatron's flex dispatcher (its backend flag defaults to deepep; stated anyway)
    assert c.moe_grouped_gemm and (c.moe_token_dispatcher_type, c.moe_flex_dispatcher_backend) == (
        ("flex", "deepep") if dispatcher == "deepep" else ("alltoall", "deepep"))
    assert sum(c.moe_layer_freq) == m.num_moe_layers and len(c.moe_layer_freq) == m.num_layers
    assert c.moe_router_score_function == m.router
    # Qwen3's q_norm/k_norm (a model without them is another model); with MLA the flag builds the latents' norms,
    # which DeepSeek's attention always has (megatron-core gpt_layer_specs: LayerNormLinear up-projections)
    assert c.qk_layernorm == (m.qk_norm or m.mla)
    if m.mla:
        assert c.multi_latent_attention and (c.q_lora_rank, c.kv_lora_rank) == (m.q_lora_rank, m.kv_lora_rank)
        assert (c.qk_head_dim, c.qk_pos_emb_head_dim, c.v_head_dim) == (m.qk_nope_head_dim, m.qk_rope_head_dim,
                                                                        m.v_head_dim)
        assert c.moe_shared_expert_intermediate_size == 2048
    assert c.moe_router_enable_expert_bias == m.router_bias  # DeepSeek-V3 and Kimi-K2 only
    assert c.overlap_moe_expert_parallel_comm == plan.ep_overlap
    assert c.mtp_num_layers == (m.mtp_layers or None)  # DeepSeek-V3 trains its MTP module, as Megatron-Bridge's
    # and routes as its config.json does: node-limited groups (8, 4) and scaled routed outputs (2.5; Kimi 2.827)
    assert (c.moe_router_num_groups, c.moe_router_group_topk) == (
        (m.moe_router_groups, m.moe_router_group_topk) if m.moe_router_groups else (None, None))
    assert c.moe_router_topk_scaling_factor == (m.moe_router_scaling if m.moe_router_scaling != 1.0 else None)
    if c.pipeline_model_parallel_layout is not None and m.mtp_layers:
        assert c.pipeline_model_parallel_layout.layout[-1][-1][-2:] == [LayerType.mtp, LayerType.loss]


@pytest.mark.parametrize("case", ["deepseek_v3_pipelined", "deepseek_v3_layout"])
def test_every_layer_recompute_leaves_the_mtp_module_stored_as_costed(case: str) -> None:
    """multi_token_prediction.py checkpoints the MTP module under --recompute-method uniform only (block skips
    it), and the cost model keeps its activations: so every-layer recompute of an MTP model is written as block
    over the largest chunk, which megatron-core applies to every decoder layer."""
    model, plan = CASES[case]
    script = dict(emit_megatron(_inp(model, "h100-sxm", JOB, plan)).files)["launch_megatron.sh"]
    _, v = validate_launch(script, tokenizer_vocab=129280)
    largest = max(-(-n // plan.vpp) for n in plan.layers_per_stage)
    assert (v.config.recompute_method, v.config.recompute_num_layers) == ("block", largest)
    assert v.recomputed_per_chunk == v.chunk_layers  # every decoder layer, as uniform would
    dense = dict(emit_megatron(_inp("llama3-70b", "h100-sxm", JOB, replace(
        plan, ep=1, etp=1, layers_per_stage=(80 // plan.pp,) * plan.pp))).files)["launch_megatron.sh"]
    assert "--recompute-method uniform" in dense  # without MTP nothing changes


def test_the_planner_deepseek_plan_validates() -> None:
    """The plan the planner returns for the acceptance command (DeepSeek-V3, 1024 H100s, batch 4096 x 4096),
    emitted and checked end to end."""
    from autotune.catalog import load_model
    res = search(load_model("deepseek-v3"), load_hardware("h100-sxm"), JOB, 1024, SearchSpace(), top_k=0)
    assert res.status == "OPTIMAL" and res.best.plan.ep > 1
    _validate(_inp("deepseek-v3", "h100-sxm", JOB, res.best.plan))


def test_megatron_rejects_what_the_plan_rules_reject() -> None:
    """The MoE fields do reach megatron-core's checks: an expert bias with softmax scores is refused there
    (TransformerConfig: aux-loss-free routing needs sigmoid), which the emitter never writes."""
    model, plan = CASES["mixtral_8x22b"]
    script = dict(emit_megatron(_inp(model, "h100-sxm", JOB, plan)).files)["launch_megatron.sh"]
    launch, _ = validate_launch(script, tokenizer_vocab=32768)
    argv = list(launch.argv)
    assert "--moe-router-enable-expert-bias" not in argv
    with pytest.raises(MegatronArgsError, match="sigmoid"):
        validate_args(argv + ["--moe-router-enable-expert-bias"], launch.world_size)


def test_layer_pattern() -> None:
    from autotune.catalog import load_model
    assert moe_layer_pattern(load_model("deepseek-v3")) == "([0]*3+[1]*58)"
    assert moe_layer_pattern(load_model("mixtral-8x7b")) == "([1]*32)"


def test_header_names_the_expert_layout() -> None:
    """The header's plan line carries ep, etp and Megatron's expert-data-parallel degree, tp*cp*dp/(ep*etp):
    qwen3_235b_etp has 4*1*128/(16*4) = 8; a dense plan's line has no expert fields."""
    model, plan = CASES["qwen3_235b_etp"]
    script = dict(emit_megatron(_inp(model, "h100-sxm", JOB, plan)).files)["launch_megatron.sh"]
    assert "# plan: tp 4, pp 2, dp 128, cp 1, ep 16, etp 4 (expert dp 8), mbs 1 x 32," in script
    dense = dict(emit_megatron(_inp("llama3-8b", "h100-sxm", JOB, Plan(tp=2, pp=1, dp=4, mbs=1,
                                     num_microbatches=1024, layers_per_stage=(32,)))).files)["launch_megatron.sh"]
    assert "# plan: tp 2, pp 1, dp 4, cp 1, mbs 1 x 1024," in dense


def test_sliding_window_models_warn_that_the_script_trains_full_attention() -> None:
    """GPT-OSS alternates 128-token windows with full attention; the estimate costs the windows, the Megatron
    script sets none, so the emitter says so and re-estimates the header for it (torchtitan builds the windows
    in its own gpt-oss model; a sequence inside the window changes nothing)."""
    from autotune.emit import emit, full_attention_warning

    plan = Plan(tp=1, pp=4, dp=16, ep=8, mbs=1, num_microbatches=8, zero=1, layers_per_stage=(9, 9, 9, 9))
    job = replace(JOB, global_batch=128)
    inp = _inp("gpt-oss-120b", "h100-sxm", job, plan)
    warning = full_attention_warning("megatron", inp)
    assert warning is not None and "18 of 36 layers" in warning and "128-token window" in warning
    assert warning in emit("megatron", inp).warnings
    assert full_attention_warning("torchtitan", inp) is None
    short = _inp("gpt-oss-120b", "h100-sxm", replace(job, seq_len=128), plan)
    assert full_attention_warning("megatron", short) is None
    assert full_attention_warning("megatron", _inp(*CASES["mixtral_8x22b"][:1], "h100-sxm", JOB,
                                                   CASES["mixtral_8x22b"][1])) is None


def test_yarn_models_warn_that_the_config_trains_plain_rope() -> None:
    """DeepSeek-V3's and GPT-OSS's config.json carry YaRN (factor 40 and 32); the Megatron config writes plain
    RoPE and says so; torchtitan's own models of them build YaRN themselves (no warning); Llama 3.1's llama3
    scaling is written, so no warning either."""
    from autotune.emit import emit, rope_scaling_warning

    model, plan = CASES["deepseek_v3_pipelined"]
    inp = _inp(model, "h100-sxm", JOB, plan)
    warning = rope_scaling_warning("megatron", inp)
    assert warning is not None and "YaRN rope scaling (factor 40)" in warning and "base 10000" in warning
    assert warning in emit("megatron", inp).warnings
    assert rope_scaling_warning("torchtitan", inp) is None
    assert "by type and factor only" in rope_scaling_warning("deepspeed", inp)  # its model dict carries them
    dense = Plan(tp=2, pp=1, dp=4, mbs=1, num_microbatches=1024, layers_per_stage=(32,))
    assert rope_scaling_warning("megatron", _inp("llama3.1-8b", "h100-sxm", JOB, dense)) is None
    # Gemma 3's linear scaling (position interpolation, factor 8): said the same way, torchtitan included (it
    # ships no Gemma 3)
    gemma = _inp("gemma3-27b", "h100-sxm", JOB, Plan(tp=8, pp=1, dp=1, mbs=1, num_microbatches=4096,
                                                    layers_per_stage=(62,)))
    for trainer in ("megatron", "torchtitan"):
        assert "linear (position interpolation) rope scaling (factor 8) is not in the" in rope_scaling_warning(
            trainer, gemma)
    said = rope_scaling_warning("deepspeed", gemma)
    assert "by type and factor only: the model code" in said and "beta_fast" not in said


def test_a_trainer_without_deepep_says_its_config_runs_alltoall() -> None:
    """A plan priced with DeepEP, emitted for torchtitan (NCCL all-to-alls): a warning that the step will be
    slower; for Megatron, none. A search restricted to a trainer or fork without DeepEP refuses it up front."""
    from autotune.emit import dispatcher_warning
    from autotune.specs.trainer_jobs import check_job_settings
    from autotune.specs.trainers import FORK_CAPS, TRAINER_CAPS
    from autotune.errors import SpecError

    model, plan = CASES["qwen3_235b_etp"]
    inp = _inp(model, "h100-sxm", replace(JOB, moe_dispatcher="deepep"), plan)
    warning = dispatcher_warning(TRAINER_CAPS["torchtitan"], inp)
    assert warning is not None and "deepep" in warning and "re-estimated for what it runs" in warning
    assert dispatcher_warning(TRAINER_CAPS["megatron"], inp) is None
    assert dispatcher_warning(TRAINER_CAPS["torchtitan"], replace(inp, job=JOB)) is None
    check_job_settings(TRAINER_CAPS["megatron"], inp.job)
    for caps in (TRAINER_CAPS["torchtitan"], FORK_CAPS["vocab-parallel"], FORK_CAPS["zero-bubble"]):
        with pytest.raises(SpecError, match="--moe-dispatcher deepep"):
            check_job_settings(caps, inp.job)


@pytest.mark.parametrize("capacity,pad", [(1.25, False), (2.0, True)])
def test_capacity_factor_flags_pass_megatron_validation(capacity: float, pad: bool) -> None:
    """--moe-capacity-factor (and padding) as Megatron's flags, checked by megatron-core's TransformerConfig."""
    model, plan = CASES["mixtral_8x22b"]
    job = replace(JOB, moe_capacity_factor=capacity, moe_pad_to_capacity=pad)
    inp = _inp(model, "h100-sxm", job, plan)
    _validate(inp)
    _, v = validate_launch(dict(emit_megatron(inp).files)["launch_megatron.sh"], tokenizer_vocab=inp.model.vocab_size)
    assert (v.config.moe_expert_capacity_factor, v.config.moe_pad_expert_input_to_capacity) == (capacity, pad)
