"""What Megatron-Bridge's MoE pretrain recipes set that its performance-summary rows leave blank (RULES
'moe_recipe' in rules.py): recompute, token dispatcher, gradient and Adam state precision, pipeline layouts."""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.costmodel.estimate import CostModel
from autotune.reports.accuracy import row_models
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan
from autotune.units import gib


@dataclass(frozen=True, slots=True)
class MoeRecipe:
    """What a Megatron-Bridge MoE pretrain recipe sets that the rows leave blank (RULES 'moe_recipe')."""

    recompute: str
    dispatcher: str
    grad_reduce: str = "fp32"
    """fp32 where the recipe keeps ddp.grad_reduce_in_fp32 = True (_pretrain_common's default)."""
    optimizer_states: str = "fp32"
    """JobSpec.optimizer_states of its precision-aware optimizer settings."""


#: The MoE models' Megatron-Bridge 0.3.1 pretrain recipes, by catalog name: DeepSeek-V3's sets
#: grad_reduce_in_fp32 = False and use_precision_aware_optimizer with bf16 moments and main gradients, under
#: MixedPrecisionConfig's default fp8_recipe "tensorwise", which megatron-core's optimizer reads even in a bf16 run
#: (so whole fp32 master weights: bf16-moments); the others, Kimi-K2's default Muon variant included, keep fp32
MOE_RECIPES = {"qwen3-30b-a3b": MoeRecipe("full", "deepep"), "qwen3-235b-a22b": MoeRecipe("none", "deepep"),
               "deepseek-v3": MoeRecipe("selective", "deepep", "bf16", "bf16-moments"),
               "gpt-oss-120b": MoeRecipe("none", "alltoall"), "gpt-oss-20b": MoeRecipe("none", "alltoall"),
               "kimi-k2": MoeRecipe("selective", "alltoall")}
MOE_RECIPE_SOURCES = ("megatron_bridge_perf_summary",)
#: Decoder layers per virtual stage (in virtual order) of the recipes' explicit pipeline layouts, by catalog
#: name and (pp, vp): megatron-bridge 0.3.1 recipes/deepseek/deepseek_v3.py
#: set_deepseek_v3_pipeline_model_parallel_layout (the embedding opens the first stage; the MTP module and the
#: loss close the last, which holds fewer decoder layers)
RECIPE_LAYOUTS: dict[str, dict[tuple[int, int], tuple[int, ...]]] = {"deepseek-v3": {
    (4, 1): (16, 16, 16, 13), (8, 1): (8,) * 7 + (5,), (4, 2): (8,) * 7 + (5,), (16, 1): (4,) * 15 + (1,),
    (8, 2): (4,) * 15 + (1,), (4, 4): (4,) * 15 + (1,)}}
#: recipes/kimi/kimi_k2.py _get_kimi_k2_pipeline_layout: the same stages, the loss without an MTP module
RECIPE_LAYOUTS["kimi-k2"] = {**RECIPE_LAYOUTS["deepseek-v3"], (2, 8): (4,) * 15 + (1,)}

#: RULES 'cross_entropy' (rules.row_job)
CROSS_ENTROPY_RULE = (
    "megatron rows: Megatron-Bridge's, the fusion their model's pretrain recipe sets (megatron-bridge 0.3.1: "
    "cross_entropy_loss_fusion = True everywhere, cross_entropy_fusion_impl 'te' in the llama3, qwen3, qwen3_moe, "
    "deepseek, kimi and moonlight pretrain recipes, 'native' in the others: gpt_oss, qwen2, llama2, gemma, glm, "
    "nemotronh, olmoe, gpt3; a model without a recipe takes GPTModelProvider's fusion, native); NeMo 2.0's and the "
    "Megatron-LM examples' (which follow NeMo's performance scripts) native (NeMo 2.0 GPTConfig "
    "cross_entropy_loss_fusion = True, nemo_toolkit 2.0.0 and 2.3.0; megatron-core's default impl); NeMo 1.0 "
    "launcher rows unfused (NeMo 1.0 copies it from the Hydra model config, megatron_base_model.py "
    "build_transformer_config; that the launcher's Llama configs leave it unset is assumed, not read); other "
    "Megatron-LM rows unfused (no --cross-entropy-loss-fusion); torchtitan unfused (F.cross_entropy on fp32 logits)")
#: Model-name prefixes (letters and digits) whose Megatron-Bridge pretrain recipe runs Transformer Engine's loss
TE_LOSS_RECIPES = ("llama3", "qwen3", "deepseek", "kimi", "moonlight")


def row_cross_entropy(source_id: str, framework: str, model_name: str) -> str:
    """RULES 'cross_entropy': the loss kernel a megatron row ran (JobSpec.cross_entropy)."""
    name = "".join(ch for ch in model_name.lower() if ch.isalnum())
    if source_id in MOE_RECIPE_SOURCES:
        te = name.startswith(TE_LOSS_RECIPES) and not name.startswith("qwen3next")
        return "te" if te else "native"
    if "nemo 2" in framework.lower() or source_id == "megatron_lm_examples_llama":
        return "native"
    return "unfused"


def recipe_layout(row: dict[str, str], model: ModelSpec, pp: int, vpp: int) -> tuple[int, ...] | None:
    """RULES 'moe_recipe': the layers per pipeline rank of the recipe's explicit layout for (pp, vp), if the
    row's model recipe has one."""
    if not model.is_moe or row["source_id"].strip() not in MOE_RECIPE_SOURCES:
        return None
    name = row_models.catalog_match(row["model"])
    stages = RECIPE_LAYOUTS.get(name, {}).get((pp, vpp)) if name else None
    if stages is None or sum(stages) != model.num_layers:
        return None
    return tuple(sum(stages[j] for j in range(rank, len(stages), pp)) for rank in range(pp))


def least_fitting_recompute(plan: Plan, model: ModelSpec, job: JobSpec, hw: HardwareSpec) -> tuple[Plan, str]:
    """RULES 'recompute' for a row that does not say: the plan as its rule gives it if it fits, else the least
    recomputation that does (selective, else full), with a note; unchanged if none fits (reported as not fitting).
    GPT-OSS-120B's NeMo 25.11 row (mbs 4 at pp 4: 144 GiB without recompute) ran, so it recomputed."""
    cm = CostModel(model, hw, job)
    first = cm.estimate(plan)
    if first.fits:
        return plan, ""
    order = ("none", "selective", "full")
    for mode in order[order.index(plan.recompute) + 1:]:
        est = cm.estimate(replace(plan, recompute=mode, recompute_layers=None))
        if est.fits:
            return est.plan, (f"recompute {plan.recompute} does not fit ({gib(first.peak_memory_bytes):.1f} GiB); "
                              f"evaluated with {mode}, the least recomputation that fits")
    return plan, ""
