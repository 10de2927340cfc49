"""The training job: batch, sequence, precision and which fused kernels the trainer uses."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from autotune.errors import SpecError
from autotune.specs.limits import MAX_GLOBAL_BATCH, MAX_MOE_FACTOR, MAX_SEQ_LEN, check_max
from autotune.units import FP32_BYTES

DTYPES = ("bf16", "fp16", "fp8")
#: MoE token dispatchers the cost model prices (JobSpec.moe_dispatcher)
MOE_DISPATCHERS = ("alltoall", "deepep")
#: Gradient-buffer dtypes the cost model prices (JobSpec.grad_reduce)
GRAD_REDUCES = ("fp32", "bf16", "fp16")
#: Attention kernels of PyTorch's SDPA the cost model prices (JobSpec.attention_backend)
ATTENTION_BACKENDS = ("cudnn", "flash")
#: How messages name them
ATTENTION_NAMES = {"cudnn": "cuDNN", "flash": "FlashAttention-2"}
#: The attention kernel a trainer's own code fixes (JobSpec.runs_attention); DeepSpeed's is the installed PyTorch's
OWN_ATTENTION = {"megatron": "cudnn", "torchtitan": "cudnn", "colossalai": "flash"}
#: Adam state layouts the cost model prices (JobSpec.optimizer_states)
OPTIMIZER_STATES = ("fp32", "bf16", "bf16-moments")
#: Cross-entropy implementations the cost model prices (JobSpec.cross_entropy, costmodel/ops.py head ops)
CROSS_ENTROPIES = ("unfused", "native", "te")


def state_zero_stages(trainer: str, optimizer_states: str) -> tuple[int, ...]:
    """ZeRO stages an Adam state layout is costed under with `trainer`: fp32 under any; 16-bit states in Megatron's
    distributed optimizer (1) only (its precision-aware optimizer needs one; its FSDP keeps fp32 master weights);
    torchtitan's bf16 moments (optimizer.implementation fused_opt_states_bf16: fp32 parameters, bf16 Adam states,
    any optimizer placement) under any of its stages; DeepSpeed's bf16 master weights and states
    (bf16_master_weights_and_grads, bf16_optimizer_states) under ZeRO 1-3, which its config check asks for."""
    if optimizer_states == "fp32" or (trainer == "torchtitan" and optimizer_states == "bf16-moments"):
        return (0, 1, 2, 3)
    if trainer == "deepspeed" and optimizer_states == "bf16":
        return (1, 2, 3)
    return (1,)


#: The JobSpec switches of what a trainer's config overlaps (specs/overlap.py); autotune's own configs turn every one on
OVERLAP_KEYS = ("overlap_grad_reduce", "overlap_param_gather", "overlap_p2p")
#: Trainers whose kernels and overlap the cost model knows (their differences: costmodel/layer.py, ops.py)
TRAINERS = ("megatron", "torchtitan", "deepspeed", "colossalai")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """One optimizer step of mixed-precision Adam training."""

    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int
    """Tokens per sequence."""
    dtype: Literal["bf16", "fp16", "fp8"] = "bf16"
    """Compute dtype of the matrix multiplies; activations stay 16-bit, master weights fp32."""
    flash_attention: bool = True
    """Fused attention (FlashAttention): no s x s score matrix in memory, causal half skipped."""
    fused_kernels: bool = True
    """Fused bias+activation, bias+dropout+residual and softmax kernels (paper 5's fusion)."""
    grad_reduce: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Dtype of the gradient buffers and their data-parallel reduction: fp32 is Megatron-LM's default with bf16
    (validate_args forces accumulate_allreduce_grads_in_fp32 for bf16); bf16 (--grad-reduce-in-bf16, NeMo's
    performance recipes) halves both, and the distributed optimizer then keeps an fp32 copy of its gradient shard
    (Megatron's distributed-optimizer docs: 4 + 16/d bytes per parameter). fp16: fp16 training's buffers in the
    parameters' dtype, Megatron-LM's default with --fp16 (its validate_args forces fp32 only for bf16; fp32 needs
    --accumulate-allreduce-grads-in-fp32), the same bytes as bf16."""
    optimizer_states: Literal["fp32", "bf16", "bf16-moments"] = "fp32"
    """Adam's state under Megatron's distributed optimizer (ZeRO-1). bf16: its precision-aware optimizer
    (--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16; DeepSeek-V3 trained with bf16
    moments, its report's Section 3.3.3) as Megatron-LM runs it by default (bf16, or fp8 with the delayed recipe):
    the fp32 master weights kept as the 16 bits the bf16 weights lack (Transformer Engine's
    store_param_remainders) and no fp32 copy of the gradient shard. bf16-moments: the same optimizer under another
    fp8 recipe (tensorwise, blockwise, mxfp8; Megatron-Bridge sets tensorwise even for bf16 runs), where
    megatron-core keeps whole fp32 master weights and an fp32 gradient copy, so only the moments shrink; torchtitan
    0.3's optimizer.implementation fused_opt_states_bf16 keeps the same (fp32 parameters, bf16 moments) under FSDP2.
    StateBytes has the bytes (megatron-core 0.16 distrib_optimizer.py); state_zero_stages where each is costed."""
    overlap_grad_reduce: bool = True
    """Megatron reduces gradients bucket by bucket during the last micro-batch's backward and gathers the
    distributed optimizer's weights during the next forward (overlap_grad_reduce, overlap_param_gather). False:
    each stage reduces its whole buffer once its backward ends (and gathers before its forward), as Megatron-LM's
    LocalDDP did in the SC'21 paper's runs (overlap.overlaps_grad_reduce: DeepSpeed also reduces after the
    backward with a pipeline or without ZeRO)."""
    overlap_param_gather: bool = True
    """Megatron's distributed optimizer gathers the updated weights bucket by bucket during the next forward
    (--overlap-param-gather, which autotune's config sets). False: in the optimizer step, as DeepSpeed's and
    Colossal-AI's ZeRO-1/2 always do (overlap.gathers_params_in_step)."""
    overlap_p2p: bool = True
    """Megatron's interleaved schedule posts each steady-state pipeline send and receive beside the next pass and
    waits only before the pass that needs it (overlap_p2p_comm: Megatron-LM's default, --no-overlap-p2p-
    communication turns it off; NeMo 2.0 sets it whenever vpp > 1). False: every send blocks, as before 2023 and
    the SC'21 paper's runs (overlap.overlaps_p2p)."""
    async_tp_backward: bool = True
    """Megatron issues the backward's tensor-parallel input-gradient collectives asynchronously, behind the
    weight-gradient GEMMs (since late 2021; the SC'21 paper's runs predate it). Only Megatron has it."""
    moe_imbalance: float = 1.25
    """MoE models: tokens of the busiest expert over the mean. The default is ROUTED_IMBALANCE (real learned
    routing); published throughput benchmarks force balanced routing, 1.0 (costmodel/moe.py)."""
    moe_dispatcher: Literal["alltoall", "deepep"] = "alltoall"
    """MoE models: how tokens reach their experts. 'alltoall': NCCL all-to-alls of every routed copy
    (Megatron's --moe-token-dispatcher-type alltoall); 'deepep': DeepEP's fused dispatch and combine kernels
    (Megatron's flex dispatcher, --moe-flex-dispatcher-backend deepep), which send a token once per
    destination GPU and once per destination node over the network (costmodel/moe.py). DeepEP must be
    installed on the cluster; autotune never assumes it."""
    moe_capacity_factor: float = 0.0
    """MoE models: Megatron's --moe-expert-capacity-factor C; 0 = dropless (every routed token is processed). With
    C > 0 an expert takes at most C times the mean tokens and drops the rest, so the busiest carries
    min(moe_imbalance, C) times the mean (moe_load)."""
    moe_pad_to_capacity: bool = False
    """MoE models with a capacity factor: every expert's input padded to its capacity (Megatron's
    --moe-pad-expert-input-to-capacity), so every expert runs C times the mean tokens."""
    trainer: Literal["megatron", "torchtitan", "deepspeed", "colossalai"] = "megatron"
    """The trainer that runs the step: it decides the kernels (Transformer Engine's cuDNN attention and FP8
    casts under Megatron, PyTorch SDPA under torchtitan and DeepSpeed) and what communication overlaps."""
    attention_backend: Literal["cudnn", "flash"] | None = None
    """The attention kernel of the PyTorch trainers (torchtitan's and DeepSpeed's SDPA call, Colossal-AI's own):
    "cudnn" (cuDNN's fused attention, the kernel Transformer Engine calls) or "flash" (FlashAttention-2), about half
    its speed on an H100 (profiles/measured/h100-sxm-microbench-attention.json). None = the trainer's own
    (runs_attention); Megatron's is cuDNN only."""

    cross_entropy: Literal["unfused", "native", "te"] | None = None
    """How Megatron's loss over the logits runs. 'unfused': separate fp32 passes (Megatron-LM without
    --cross-entropy-loss-fusion); 'native': megatron-core's jit-fused passes (--cross-entropy-loss-fusion; NeMo 2.0's
    GPTConfig and Megatron-Bridge's providers turn it on); 'te': Transformer Engine's Triton kernel
    (--cross-entropy-fusion-impl te), which writes the gradient into the 16-bit logits. None = the trainer's own;
    the PyTorch trainers run F.cross_entropy on upcast logits whatever it says (runs_cross_entropy)."""

    def __post_init__(self) -> None:
        if self.global_batch <= 0:
            raise SpecError(f"--global-batch must be > 0, got {self.global_batch}")
        if self.seq_len <= 0:
            raise SpecError(f"--seq-len must be > 0, got {self.seq_len}")
        check_max(self.global_batch, MAX_GLOBAL_BATCH, "--global-batch")
        check_max(self.seq_len, MAX_SEQ_LEN, "--seq-len")
        if self.dtype not in DTYPES:
            raise SpecError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.grad_reduce not in GRAD_REDUCES:
            raise SpecError(f"--grad-reduce must be one of {', '.join(GRAD_REDUCES)}, got {self.grad_reduce!r}")
        if self.grad_reduce == "bf16" and self.dtype == "fp16":
            raise SpecError("--grad-reduce bf16 with --dtype fp16: gradient buffers take the fp16 parameters' dtype "
                            "unless fp32 (Megatron and DeepSpeed alike); use --grad-reduce fp16, or leave it out for "
                            "the trainer's own")
        if self.grad_reduce == "fp16" and self.dtype != "fp16":
            raise SpecError(f"--grad-reduce fp16 keeps fp16 training's gradients in fp16; with --dtype {self.dtype} "
                            "use --grad-reduce bf16 or fp32, or leave it out for the trainer's own")
        if self.optimizer_states not in OPTIMIZER_STATES:
            raise SpecError(f"--optimizer-states must be one of {', '.join(OPTIMIZER_STATES)}, got "
                            f"{self.optimizer_states!r}")
        if not 1.0 <= self.moe_imbalance <= MAX_MOE_FACTOR:
            raise SpecError(f"moe_imbalance must be in [1, {MAX_MOE_FACTOR:g}] (busiest expert's tokens over the "
                            f"mean), got {self.moe_imbalance}")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise SpecError(f"--moe-dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, got "
                            f"{self.moe_dispatcher!r}")
        if not 0.0 <= self.moe_capacity_factor <= MAX_MOE_FACTOR:  # also NaN
            raise SpecError(f"--moe-capacity-factor {self.moe_capacity_factor:g}: an expert's capacity over the mean "
                            f"tokens must be > 0 and <= {MAX_MOE_FACTOR:g} (leave it out for dropless routing)")
        if self.moe_pad_to_capacity and not self.moe_capacity_factor:
            raise SpecError("--moe-pad-to-capacity pads each expert to its capacity: give --moe-capacity-factor too")
        if self.moe_capacity_factor and self.moe_dispatcher != "alltoall":
            raise SpecError(f"--moe-capacity-factor is costed for the alltoall dispatcher (DeepEP's kernels are "
                            f"dropless); drop it or use --moe-dispatcher alltoall")
        if self.trainer not in TRAINERS:
            raise SpecError(f"--kernels (or --trainer) must be one of {', '.join(TRAINERS)}, got {self.trainer!r}")
        if self.attention_backend not in (None, *ATTENTION_BACKENDS):
            raise SpecError(f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, got "
                            f"{self.attention_backend!r}")
        if self.attention_backend is not None and not self.flash_attention:
            raise SpecError(f"--attention-backend {self.attention_backend} chooses a fused attention kernel, but "
                            "--no-flash-attention costs unfused attention; drop one of them")
        if self.cross_entropy not in (None, *CROSS_ENTROPIES):
            raise SpecError(f"cross_entropy must be one of {', '.join(CROSS_ENTROPIES)}, got {self.cross_entropy!r}")
        if self.trainer == "megatron" and self.attention_backend == "flash":
            raise SpecError("--attention-backend flash: Megatron's attention is costed as Transformer Engine's fused "
                            "(cuDNN) kernel; the flag chooses the PyTorch trainers' kernel (--kernels torchtitan, "
                            "deepspeed or colossalai)")

    @property
    def runs_attention(self) -> str:
        """The attention kernel the step runs: attention_backend where given, else the trainer's own. Megatron:
        Transformer Engine's fused attention, cuDNN's. torchtitan 0.2.2 and 0.3.0 ask SDPA for cuDNN first
        (models/attention.py, 0.3.0's models/common/attention.py: sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION,
        MATH], set_priority=True), "remove after PyTorch 2.9", whose own priority puts cuDNN first on Hopper).
        DeepSpeed runs the user's model code through SDPA at the installed PyTorch's priority: cuDNN on an H100
        with 2.11 (measured: the default ran 626-643 TFLOP/s, cuDNN 589-641, flash 353-359 at 32k tokens).
        Colossal-AI calls FlashAttention-2 itself."""
        if self.attention_backend is not None:
            return self.attention_backend
        return OWN_ATTENTION.get(self.trainer, "cudnn")

    @property
    def runs_cross_entropy(self) -> str:
        """The loss kernel the step runs. Megatron: cross_entropy where given, else the native fusion, which
        autotune's Megatron configs turn on (--cross-entropy-loss-fusion); the PyTorch trainers: F.cross_entropy on
        fp32 logits, unfused, whatever a Megatron config this job was read from said (the fused kernels are
        Megatron's, so a job re-costed for another trainer keeps no Megatron choice)."""
        if self.trainer != "megatron":
            return "unfused"
        return "native" if self.cross_entropy is None else self.cross_entropy

    @property
    def moe_load(self) -> float:
        """Tokens of the busiest expert over the mean, what the step waits for: the routing imbalance, capped at
        the capacity factor where tokens beyond it are dropped, or the capacity itself where inputs are padded."""
        if not self.moe_capacity_factor:
            return self.moe_imbalance
        return self.moe_capacity_factor if self.moe_pad_to_capacity else min(self.moe_imbalance,
                                                                             self.moe_capacity_factor)

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient element in the buffers and on the wire."""
        return GRAD_BYTES if self.grad_reduce == "fp32" else 2

    @property
    def state_bytes(self) -> StateBytes:
        """Bytes per parameter of the training state this job keeps (StateBytes)."""
        # an fp32 copy of the 16-bit gradient shard, unless the precision-aware optimizer steps on the buffer
        copy = FP32_BYTES if self.grad_bytes < GRAD_BYTES and self.optimizer_states != "bf16" else 0
        if self.optimizer_states == "fp32":
            return StateBytes(grad=self.grad_bytes, grad_copy=copy)
        # bf16 m and v; the master weights as 16-bit remainders beside bf16 weights (distrib_optimizer.py allocates
        # them as int16 when store_param_remainders and bf16), whole fp32 beside fp16 ones or under bf16-moments
        master = WEIGHT_BYTES if self.optimizer_states == "bf16" and self.dtype != "fp16" else FP32_BYTES
        return StateBytes(grad=self.grad_bytes, optimizer=master + 2 * 2, grad_copy=copy)

    @property
    def state_zero_stages(self) -> tuple[int, ...]:
        """ZeRO stages its Adam state layout is costed under (state_zero_stages)."""
        return state_zero_stages(self.trainer, self.optimizer_states)

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimizer step."""
        return self.global_batch * self.seq_len


#: Bytes of state per parameter under mixed-precision Adam as Megatron-LM keeps it (docs of its
#: distributed optimizer): 16-bit weights, fp32 main gradients, fp32 master copy + Adam m and v.
WEIGHT_BYTES = 2
GRAD_BYTES = 4
OPTIMIZER_BYTES = 12


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per parameter of mixed-precision Adam's training state, by what ZeRO shards: the 16-bit weights
    (stage 3), the gradient buffer (stage 2), and what the optimizer holds (stage 1). The defaults are Megatron-LM's
    (the docs of its distributed optimizer: 2 + 4 + 12, 6 + 12/d bytes with it)."""

    weight: int = WEIGHT_BYTES
    grad: int = GRAD_BYTES
    """The gradient buffer's element (what data parallelism reduces)."""
    optimizer: int = OPTIMIZER_BYTES
    """Master weights and Adam's m and v."""
    grad_copy: int = 0
    """The fp32 copy of 16-bit gradients the optimizer steps on (its shard, with a distributed optimizer)."""


def check_moe_imbalance(imbalance: float, num_experts: int, top_k: int, model_name: str, field: str) -> None:
    """A token's top-k experts are distinct, so the busiest expert gets at most every token: E/k times the mean.
    A larger routing load names `field` (the flag, or a document's key) and the most it may be."""
    most = num_experts / top_k
    if most < imbalance <= MAX_MOE_FACTOR:  # past it the range check names the range
        said = f"{math.floor(most * 1e4) / 1e4:g}"  # rounded down, so the value named is one it takes
        raise SpecError(f"{field} {imbalance:g}: {model_name}'s busiest expert gets at most every token, "
                        f"{num_experts} experts / top-{top_k} = {most:.6g} times the mean; give at most {said}")
