"""Values of a torchtitan config that `check` reads through a rule of its own: a key with a type (get), the
activation checkpointing of MemoryBudgetAC, the optimizer's state precision, whether the model is compiled."""

from __future__ import annotations

import re
from typing import Any

from autotune.errors import SpecError


def get(tree: dict[str, Any], section: str, key: str, kind: type, default: Any) -> Any:
    value = tree.get(section, {}).get(key, default)
    if value is default:
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise SpecError(f"{section}.{key} must be an integer, got {value!r}; write it without quotes")
    if kind is bool and not isinstance(value, bool):
        raise SpecError(f"{section}.{key} must be true or false, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise SpecError(f"{section}.{key} must be a string, got {value!r}")
    return value


def memory_budget(tree: dict[str, Any], notes: list[str]) -> str:
    """torchtitan 0.3.0's MemoryBudgetAC: torch.compile's partitioner recomputes what keeps the activations within
    memory_budget (default 0.5) of the way from full checkpointing (0) to none (1). Its choice is the compiler's, so
    the ends read as full and none, and a budget between them as selective, with a note."""
    budget = tree.get("activation_checkpoint", {}).get("memory_budget", 0.5)
    if isinstance(budget, str) and re.fullmatch(r"\d*\.?\d+", budget):  # a command-line value: its text
        budget = float(budget)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 <= budget <= 1:
        raise SpecError(f"activation_checkpoint.memory_budget must be a number from 0 to 1, got {budget!r}")
    if budget in (0, 1):
        return "full" if budget == 0 else "none"
    notes.append(f"activation_checkpoint memory_budget {budget:g}: torch.compile's partitioner picks what to "
                 "recompute; costed as selective recomputation")
    return "selective"


#: optimizer.implementation's values (torchtitan 0.3.0 OptimizersContainer.Config; 0.2.x lacks the last)
IMPLEMENTATIONS = ("for-loop", "foreach", "fused", "fused_opt_states_bf16")


def optimizer_states(tree: dict[str, Any], fmt: str) -> str:
    """JobSpec.optimizer_states of optimizer.implementation: 0.3.0's fused_opt_states_bf16 keeps Adam's moments in
    bf16 beside fp32 parameters (bf16-moments); the others keep fp32 states."""
    section = tree.get("optimizer")
    implementation = str(section.get("implementation", "fused")) if isinstance(section, dict) else "fused"
    if implementation not in IMPLEMENTATIONS:  # torchtitan's Literal refuses the rest
        raise SpecError(f"optimizer.implementation {implementation!r}: torchtitan takes one of "
                        f"{', '.join(IMPLEMENTATIONS)}; fix it")
    reduce = get(tree, "training", "mixed_precision_reduce", str, "float32")
    if reduce != "float32":
        raise SpecError(f"training.mixed_precision_reduce {reduce!r}: torchtitan reduces in float32 only "
                        "(its config's Literal); drop it or set float32")
    if implementation != "fused_opt_states_bf16":
        return "fp32"
    if fmt == "toml":
        raise SpecError("optimizer.implementation fused_opt_states_bf16: torchtitan 0.2.x takes for-loop, foreach or "
                        "fused (bf16 Adam states came in 0.3.0); use one of those")
    return "bf16-moments"


def compiled_model(tree: dict[str, Any]) -> bool:
    """torch.compile on the model, torchtitan's fused kernels: compile.enable with "model" among its components
    (torchtitan's default ["model", "loss"]; deepseek_v3_671b() compiles the loss alone)."""
    components = tree.get("compile", {}).get("components", ["model", "loss"])
    names = [c for group in components for c in (group if isinstance(group, list) else [group])]
    return get(tree, "compile", "enable", bool, False) and "model" in names
