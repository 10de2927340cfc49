"""What Megatron-Bridge's MoE pretrain recipes set that its performance-summary rows leave blank (RULES
'moe_recipe' in rules.py): recompute, token dispatcher, gradient and Adam state precision, pipeline layouts."""

from __future__ import annotations

from dataclasses import dataclass


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
