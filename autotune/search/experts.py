"""Expert-parallel layouts the search enumerates for mixture-of-experts models (issue 14)."""

from __future__ import annotations

from functools import cache

from autotune.specs.model import ModelSpec


@cache
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def expert_dp(tp: int, cp: int, dp: int, ep: int, etp: int) -> int:
    """Megatron's expert-data-parallel degree (Plan.expert_dp from bare degrees, for the search's bounds)."""
    return max(1, tp * cp * dp // (ep * etp))


def expert_options(model: ModelSpec, tp: int, cp: int, dp: int, ep_pins: tuple[int, ...] | None = None,
                   etp_pins: tuple[int, ...] | None = None) -> list[tuple[int, int]]:
    """(ep, etp) pairs of Megatron's expert layout: ep divides the experts, etp divides the expert width and is 1
    or tp (the two layouts Megatron's recipes use: experts unsplit, or split like the attention), and ep*etp
    divides the tp*cp*dp GPUs of a pipeline stage (the expert-data-parallel group is their quotient,
    megatron/core/parallel_state.py). (1, 1) for a dense model."""
    if not model.is_moe:  # a pin other than 1 empties the space (the CLI then names the pins)
        return [(1, 1)] if (ep_pins is None or 1 in ep_pins) and (etp_pins is None or 1 in etp_pins) else []
    stage = tp * cp * dp
    eps = _divisors(model.num_experts)
    etps = sorted({1, tp})
    return [(ep, etp) for ep in eps if ep_pins is None or ep in ep_pins
            for etp in etps if (etp_pins is None or etp in etp_pins)
            and model.moe_ffn_hidden_size % etp == 0 and stage % (ep * etp) == 0]


def moe_sequence_parallel(model: ModelSpec, tp: int, options: list[bool]) -> list[bool]:
    """Megatron requires sequence parallelism for expert layers when tp > 1 (TransformerConfig's check)."""
    if not (model.is_moe and tp > 1):
        return options
    return [True] if True in options else []
