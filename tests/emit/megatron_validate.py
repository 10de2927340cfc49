"""Validate a Megatron-LM launch on CPU, from PyPI packages only (../shared/TRAINERS.md section 1.3).

Megatron-LM's own parse_args/validate_args are not on PyPI, so this module
1. runs the emitted launch script under bash with a fake `torchrun` that records its arguments (so the bash
   itself, the world-size check and the array expansion are exercised too);
2. parses the pretrain_gpt.py arguments with an argparse mirror of every flag the emitter uses (plus the ones the
   broken-config tests need); an unknown flag or a bad value is an error, as in Megatron;
3. replays the validate_args rules of TRAINERS.md section 1.2 that live outside megatron-core (arguments.py line
   numbers at Megatron-LM HEAD d98e8a6), plus a few rules of autotune's own contract, marked as such;
4. builds megatron-core 0.16's TransformerConfig (its __post_init__ checks uneven PP, the layout, recompute, SP;
   pipeline_dtype is set when pp > 1), ConstantNumMicroBatchesCalculator, DistributedDataParallelConfig and
   OptimizerConfig, and asks megatron-core how many layers each (pipeline rank, virtual stage) builds.
Any rejection raises MegatronArgsError.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


class MegatronArgsError(ValueError):
    """The arguments would be rejected by Megatron-LM (or break autotune's contract)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit; raise instead
        raise MegatronArgsError(f"argparse: {message}")


# (flag, kind, extra): kind 'int' | 'float' | 'str' | 'true' (store_true) | 'false' (store_false, dest given)
_FLAGS: tuple[tuple[str, str, dict], ...] = (
    # model (arguments.py _add_network_size_args, _add_regularization_args)
    ("--num-layers", "int", {}), ("--hidden-size", "int", {}), ("--ffn-hidden-size", "int", {}),
    ("--num-attention-heads", "int", {}), ("--kv-channels", "int", {}), ("--group-query-attention", "true", {}),
    ("--num-query-groups", "int", {"default": 1}), ("--seq-length", "int", {}),
    ("--max-position-embeddings", "int", {}),
    ("--position-embedding-type", "str",
     {"choices": ["learned_absolute", "rope", "mrope", "relative", "none"], "default": "learned_absolute"}),
    ("--normalization", "str", {"choices": ["LayerNorm", "RMSNorm"], "default": "LayerNorm"}),
    ("--swiglu", "true", {}), ("--untie-embeddings-and-output-weights", "true", {}),
    ("--disable-bias-linear", "false", {"dest": "add_bias_linear"}), ("--add-qkv-bias", "true", {}),
    ("--attention-dropout", "float", {"default": 0.1}), ("--hidden-dropout", "float", {"default": 0.1}),
    ("--norm-epsilon", "float", {"default": 1e-5}), ("--init-method-std", "float", {"default": 0.02}),
    ("--rotary-base", "int", {"default": 10000}), ("--rotary-percent", "float", {"default": 1.0}),
    ("--use-rope-scaling", "true", {}),
    ("--rope-scaling-factor", "float", {"default": 8.0}),
    # data and tokenizer
    ("--mock-data", "true", {}),
    ("--tokenizer-type", "str", {"choices": ["BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer",
                                             "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
                                             "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
                                             "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer",
                                             "SFTTokenizer"]}),
    ("--vocab-size", "int", {}), ("--make-vocab-size-divisible-by", "int", {"default": 128}),
    ("--tokenizer-model", "str", {}), ("--data-path", "str", {"nargs": "*"}), ("--split", "str", {}),
    # parallelism (ModelParallelConfig / TransformerConfig fields, _add_distributed_args)
    ("--tensor-model-parallel-size", "int", {"default": 1}), ("--pipeline-model-parallel-size", "int", {"default": 1}),
    ("--context-parallel-size", "int", {"default": 1}),
    ("--cp-comm-type", "str", {"nargs": "+", "default": ["p2p"],
                               "choices": ["p2p", "a2a", "allgather", "a2a+p2p"]}),
    ("--sequence-parallel", "true", {}), ("--tp-comm-overlap", "true", {}),
    ("--decoder-first-pipeline-num-layers", "int", {}), ("--decoder-last-pipeline-num-layers", "int", {}),
    ("--account-for-embedding-in-pipeline-split", "true", {}), ("--account-for-loss-in-pipeline-split", "true", {}),
    ("--pipeline-model-parallel-layout", "str", {}), ("--num-layers-per-virtual-pipeline-stage", "int", {}),
    ("--num-virtual-stages-per-pipeline-rank", "int", {}),
    ("--no-overlap-p2p-communication", "false", {"dest": "overlap_p2p_comm"}),
    ("--microbatch-group-size-per-virtual-pipeline-stage", "int", {}),
    # batch, precision, recompute
    ("--micro-batch-size", "int", {}), ("--global-batch-size", "int", {}),
    ("--bf16", "true", {}), ("--fp16", "true", {}), ("--fp8-format", "str", {"choices": ["e4m3", "hybrid"]}),
    ("--fp8-recipe", "str", {"choices": ["tensorwise", "delayed", "mxfp8", "blockwise", "custom"],
                             "default": "delayed"}),
    ("--recompute-granularity", "str", {"choices": ["full", "selective"]}),
    ("--recompute-method", "str", {"choices": ["uniform", "block"]}), ("--recompute-num-layers", "int", {}),
    # data-parallel gradients and optimizer state
    ("--ddp-bucket-size", "int", {}), ("--overlap-grad-reduce", "true", {}), ("--overlap-param-gather", "true", {}),
    ("--use-distributed-optimizer", "true", {}), ("--use-megatron-fsdp", "true", {}), ("--use-torch-fsdp2", "true", {}),
    ("--data-parallel-sharding-strategy", "str",
     {"choices": ["no_shard", "optim", "optim_grads", "optim_grads_params"], "default": "no_shard"}),
    ("--no-gradient-accumulation-fusion", "false", {"dest": "gradient_accumulation_fusion"}),
    # gradient and optimizer-state precision: --grad-reduce-in-bf16 (arguments.py _add_mixed_precision_args), and
    # megatron-core OptimizerConfig's precision-aware optimizer fields as Megatron-LM spells them
    ("--grad-reduce-in-bf16", "true", {}), ("--use-precision-aware-optimizer", "true", {}),
    ("--accumulate-allreduce-grads-in-fp32", "true", {}),
    ("--exp-avg-dtype", "str", {"choices": ["fp32", "fp16", "bf16", "fp8"], "default": "fp32"}),
    ("--exp-avg-sq-dtype", "str", {"choices": ["fp32", "fp16", "bf16", "fp8"], "default": "fp32"}),
    ("--main-grads-dtype", "str", {"choices": ["fp32", "bf16"], "default": "fp32"}),
    ("--main-params-dtype", "str", {"choices": ["fp32", "fp16"], "default": "fp32"}),
    ("--ckpt-format", "str", {"choices": ["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"],
                              "default": "torch_dist"}),
    # kernels
    ("--transformer-impl", "str", {"choices": ["local", "transformer_engine", "inference_optimized"],
                                   "default": "transformer_engine"}),
    ("--attention-backend", "str", {"choices": ["flash", "fused", "unfused", "local", "auto"], "default": "auto"}),
    ("--no-masked-softmax-fusion", "false", {"dest": "masked_softmax_fusion"}),
    ("--no-bias-dropout-fusion", "false", {"dest": "bias_dropout_fusion"}),
    ("--no-rope-fusion", "false", {"dest": "apply_rope_fusion"}),
    ("--no-bias-swiglu-fusion", "false", {"dest": "bias_swiglu_fusion"}),
    ("--no-bias-gelu-fusion", "false", {"dest": "bias_gelu_fusion"}),
    ("--cross-entropy-loss-fusion", "true", {}),
    ("--cross-entropy-fusion-impl", "str", {"choices": ["native", "te"], "default": "native"}),
    # training
    ("--clip-grad", "float", {}), ("--eval-interval", "int", {}), ("--eval-iters", "int", {}),
    ("--log-interval", "int", {}), ("--lr", "float", {}), ("--min-lr", "float", {}), ("--train-iters", "int", {}),
    ("--weight-decay", "float", {}), ("--adam-beta1", "float", {"default": 0.9}),
    ("--adam-beta2", "float", {"default": 0.999}), ("--lr-warmup-iters", "int", {"default": 0}),
    ("--lr-decay-iters", "int", {}), ("--log-throughput", "true", {}), ("--save", "str", {}), ("--load", "str", {}),
    ("--save-interval", "int", {}),
    ("--lr-decay-style", "str", {"choices": ["constant", "linear", "cosine", "inverse-square-root", "WSD"]}),
)
#: Mixture-of-experts and multi-latent-attention flags (arguments.py _add_moe_args / _add_mla_args, core_r0.16;
#: emit/megatron_moe.py emits them)
_FLAGS += (
    ("--num-experts", "int", {}), ("--moe-router-topk", "int", {"default": 2}),
    ("--moe-ffn-hidden-size", "int", {}), ("--moe-layer-freq", "str", {"default": "1"}),
    ("--expert-model-parallel-size", "int", {"default": 1}), ("--expert-tensor-parallel-size", "int", {}),
    ("--moe-grouped-gemm", "true", {}),
    ("--moe-token-dispatcher-type", "str", {"choices": ["allgather", "alltoall", "flex"], "default": "allgather"}),
    ("--moe-flex-dispatcher-backend", "str", {"choices": ["deepep", "hybridep"], "default": "deepep"}),
    ("--moe-router-score-function", "str", {"choices": ["softmax", "sigmoid"], "default": "softmax"}),
    ("--moe-shared-expert-intermediate-size", "int", {}), ("--moe-router-enable-expert-bias", "true", {}),
    ("--multi-latent-attention", "true", {}), ("--q-lora-rank", "int", {}), ("--kv-lora-rank", "int", {"default": 32}),
    ("--qk-head-dim", "int", {"default": 128}), ("--qk-pos-emb-head-dim", "int", {"default": 64}),
    ("--v-head-dim", "int", {"default": 128}), ("--moe-expert-capacity-factor", "float", {}),
    ("--moe-pad-expert-input-to-capacity", "true", {}), ("--qk-layernorm", "true", {}),
    ("--overlap-moe-expert-parallel-comm", "true", {}),
    ("--moe-router-num-groups", "int", {}), ("--moe-router-group-topk", "int", {}),
    ("--moe-router-topk-scaling-factor", "float", {}),
    # multi-token prediction (arguments.py _add_mtp_args; TransformerConfig.mtp_num_layers)
    ("--mtp-num-layers", "int", {}), ("--mtp-loss-scaling-factor", "float", {"default": 0.1}),
)
KNOWN_FLAGS = frozenset(f for f, _, _ in _FLAGS)
#: Flags only the sail-sg/VocabularyParallelism fork adds (TRAINERS.md section 4; timer and overlap knobs left out).
_FORK_FLAGS: tuple[tuple[str, str, dict], ...] = (
    ("--enable-vocab-parallel", "true", {}), ("--disable-backward-fusion", "true", {}),
    ("--use-interlaced-schedule", "true", {}), ("--enable-layer-redistribution", "true", {}),
    ("--final-stage-num-layers", "int", {}),
)
FORK_FLAGS = frozenset(f for f, _, _ in _FORK_FLAGS)
#: Mainline flags the fork's core 0.9 arguments.py does not have (issue 12: its scripts failed on them).
NOT_IN_FORK = ("--attention-backend", "--cp-comm-type")


def parser(fork: bool = False) -> argparse.ArgumentParser:
    """The argparse mirror of pretrain_gpt.py's flags (the subset autotune emits or tests); `fork`: the
    sail-sg/VocabularyParallelism fork's, which adds its own flags (mainline rejects them as unrecognized)."""
    p = _Parser(prog="pretrain_gpt.py", allow_abbrev=False)
    for flag, kind, extra in _FLAGS + (_FORK_FLAGS if fork else ()):
        if fork and flag in NOT_IN_FORK:  # core 0.9 behaves as these flags' defaults
            p.set_defaults(**{flag[2:].replace("-", "_"): extra["default"]})
            continue
        if kind == "true":
            p.add_argument(flag, action="store_true", **extra)
        elif kind == "false":
            p.add_argument(flag, action="store_false", **extra)
        else:
            p.add_argument(flag, type={"int": int, "float": float, "str": str}[kind], **extra)
    return p


@dataclass(frozen=True)
class Launch:
    """What the launch script ran: torchrun's node arguments, the world size and pretrain_gpt.py's argv."""

    nnodes: int
    nproc_per_node: int
    argv: tuple[str, ...]
    env_cuda_max_connections: str | None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


_FAKE_TORCHRUN = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$AUTOTUNE_TORCHRUN_LOG"
printf '%s' "${CUDA_DEVICE_MAX_CONNECTIONS-<unset>}" > "$AUTOTUNE_TORCHRUN_LOG.env"
"""


#: The variables a real-run launch script requires (runfiles.REQUIRED_ENV), as the tests set them.
RUN_ENV = {"DATA_PATH": "/data/corpus_text_document", "TOKENIZER_MODEL": "/models/llama3-tokenizer",
           "CHECKPOINT_DIR": "/checkpoints/run1"}


def run_launch_script(script: str, env: dict[str, str | None] | None = None) -> Launch:
    """Run the script under bash with a fake torchrun on PATH, RUN_ENV set (a None in `env` unsets one);
    return what torchrun was given."""
    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp) / "torchrun"
        fake.write_text(_FAKE_TORCHRUN)
        fake.chmod(0o755)
        (Path(tmp) / "launch.sh").write_text(script)
        log = Path(tmp) / "torchrun.log"
        full_env = {"PATH": f"{tmp}:{os.environ.get('PATH', '/usr/bin:/bin')}", "AUTOTUNE_TORCHRUN_LOG": str(log),
                    **RUN_ENV, **(env or {})}
        full_env = {k: v for k, v in full_env.items() if v is not None}
        proc = subprocess.run(["bash", str(Path(tmp) / "launch.sh")], env=full_env, capture_output=True, text=True,
                              timeout=30)
        if proc.returncode != 0:
            raise MegatronArgsError(f"launch script failed ({proc.returncode}): {proc.stderr.strip()}")
        args = log.read_text().split("\0")[:-1]
        cuda = (Path(tmp) / "torchrun.log.env").read_text()
    torchrun = argparse.ArgumentParser(add_help=False)
    for name in ("--nnodes", "--nproc-per-node", "--node-rank", "--master-port"):
        torchrun.add_argument(name, type=int, required=True)
    torchrun.add_argument("--master-addr", required=True)
    torchrun.add_argument("script")
    known, rest = torchrun.parse_known_args(args[: args.index(next(a for a in args if a.endswith(".py"))) + 1])
    if not known.script.endswith("/pretrain_gpt.py") or rest:
        raise MegatronArgsError(f"torchrun does not run pretrain_gpt.py: {shlex.join(args)}")
    argv = tuple(args[args.index(known.script) + 1:])
    return Launch(known.nnodes, known.nproc_per_node, argv, None if cuda == "<unset>" else cuda)


# ---------------------------------------------------------------- validate_args replay and megatron-core


@dataclass(frozen=True)
class Validated:
    """What Megatron would run: the parsed arguments, derived sizes and the layers each model chunk builds."""

    args: argparse.Namespace
    dp: int
    vpp: int
    num_microbatches: int
    padded_vocab: int
    chunk_layers: tuple[tuple[int, ...], ...]
    """[pp rank][virtual stage] -> transformer layers built there (asked of megatron-core)."""
    embedding_at: tuple[int, int]
    loss_at: tuple[int, int]
    recomputed_per_chunk: tuple[tuple[int, ...], ...]
    config: object
    ddp_config: object
    scheduler: object = None
    """megatron-core's OptimizerParamScheduler as training.py builds it (steps in samples), when --train-iters."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise MegatronArgsError(message)


def _replay_validate_args(a: argparse.Namespace, world_size: int) -> None:
    """The validate_args rules (arguments.py at HEAD d98e8a6) that megatron-core does not check; fills in the
    values validate_args derives (dp, vpp, gbs default, silently disabled features)."""
    mp = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
    _check(world_size % mp == 0, f"L432: world size {world_size} not divisible by tp*pp*cp = {mp}")
    a.data_parallel_size = world_size // mp
    _check(not (a.fp16 and a.bf16), "--fp16 and --bf16 together")
    _check(a.micro_batch_size is not None and a.micro_batch_size > 0, "L692: --micro-batch-size must be > 0")
    if a.global_batch_size is None:
        a.global_batch_size = a.micro_batch_size * a.data_parallel_size
    vpp_specs = [f for f in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                             "pipeline_model_parallel_layout") if getattr(a, f) is not None]
    _check(len(vpp_specs) <= 1, f"L927: at most one of the VPP specifications, got {vpp_specs}")
    pp, extra = a.pipeline_model_parallel_size, a.account_for_embedding_in_pipeline_split + \
        a.account_for_loss_in_pipeline_split
    uneven = a.decoder_first_pipeline_num_layers is not None or a.decoder_last_pipeline_num_layers is not None
    a.virtual_pipeline_model_parallel_size = None
    if a.pipeline_model_parallel_layout is not None:
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
        stages = len(PipelineParallelLayerLayout.parse_str_to_list(a.pipeline_model_parallel_layout))
        _check(stages % pp == 0, f"L941: layout has {stages} stages, not divisible by pp={pp}")
        a.virtual_pipeline_model_parallel_size = stages // pp if stages // pp > 1 else None
    elif a.num_layers_per_virtual_pipeline_stage is not None:
        _check(not uneven, "L953: --num-layers-per-virtual-pipeline-stage with decoder-first/last")
        total = a.num_layers + extra
        _check(total % pp == 0, f"L960: layers {total} not divisible by pp {pp}")
        _check(total // pp % a.num_layers_per_virtual_pipeline_stage == 0,
               "L965: layers per rank not divisible by --num-layers-per-virtual-pipeline-stage")
        vpp = total // pp // a.num_layers_per_virtual_pipeline_stage
        a.virtual_pipeline_model_parallel_size = vpp if vpp > 1 else None
    elif a.num_virtual_stages_per_pipeline_rank is not None:
        v = a.num_virtual_stages_per_pipeline_rank
        a.virtual_pipeline_model_parallel_size = v if v > 1 else None
    if a.pipeline_model_parallel_layout is None and not uneven:
        _check((a.num_layers + extra) % pp == 0, "L980: Number of layers should be divisible by the "
               f"pipeline-model-parallel size ({a.num_layers + extra} layers, pp {pp})")
    if a.virtual_pipeline_model_parallel_size is not None:
        _check(pp > (1 if a.overlap_p2p_comm else 2), f"L1000: VPP needs pp > {1 if a.overlap_p2p_comm else 2}")
    else:
        a.overlap_p2p_comm = False
    if a.overlap_param_gather:
        _check((a.use_distributed_optimizer or a.use_megatron_fsdp) and a.overlap_grad_reduce,
               "L1024: --overlap-param-gather needs --use-distributed-optimizer (or Megatron FSDP) and "
               "--overlap-grad-reduce")
    if a.use_torch_fsdp2:
        _check(pp == 1 and not a.use_distributed_optimizer, "L1031: torch FSDP2 needs pp 1 and no dist-opt")
    _check(not (a.use_torch_fsdp2 and a.use_megatron_fsdp), "two FSDP implementations")
    if a.use_megatron_fsdp:  # autotune's contract: the flags Megatron FSDP's guide requires; no pipelining
        _check(a.use_distributed_optimizer and not a.gradient_accumulation_fusion and a.ckpt_format == "fsdp_dtensor",
               "Megatron FSDP needs --use-distributed-optimizer, --no-gradient-accumulation-fusion and "
               "--ckpt-format fsdp_dtensor")
        _check(a.data_parallel_sharding_strategy != "no_shard", "Megatron FSDP without a sharding strategy")
        _check(pp == 1, f"autotune: ZeRO-2/3 (Megatron FSDP) with pp {pp} > 1")
    if a.context_parallel_size > 1:
        _check(a.seq_length % (2 * a.context_parallel_size) == 0,
               f"L1335: seq_length {a.seq_length} not divisible by 2*cp")
        _check(a.attention_backend not in ("unfused", "local") and a.transformer_impl == "transformer_engine",
               "context parallelism needs Transformer Engine's fused/flash attention")
    if a.recompute_granularity == "selective":
        _check(a.recompute_method is None, "L1418: selective recompute takes no --recompute-method")
    if a.tensor_model_parallel_size == 1:
        a.sequence_parallel = False  # L1433, silently
    if a.tp_comm_overlap:
        _check(a.sequence_parallel, "L1442: --tp-comm-overlap needs --sequence-parallel")
    if a.kv_channels is None:
        _check(a.hidden_size % a.num_attention_heads == 0, "hidden size not divisible by heads; give --kv-channels")
    if not a.add_bias_linear:
        a.bias_gelu_fusion = False  # validate_args: no bias, no fused bias-GeLU
    if a.position_embedding_type == "learned_absolute":
        _check(a.max_position_embeddings is not None and a.max_position_embeddings >= a.seq_length,
               "--max-position-embeddings must be >= --seq-length with learned positions")
    if a.tokenizer_type == "NullTokenizer":
        _check(a.vocab_size is not None, "NullTokenizer needs --vocab-size")
    if a.tokenizer_type == "HuggingFaceTokenizer":  # build_tokenizer: the tokenizer's directory or hub name
        _check(bool(a.tokenizer_model), "HuggingFaceTokenizer needs --tokenizer-model")
    # pretrain_gpt.py's dataset provider: real data needs --data-path (or per-split paths), else --mock-data
    _check(a.mock_data or bool(a.data_path), "no data: give --data-path or --mock-data")
    if a.use_rope_scaling:
        _check(a.position_embedding_type == "rope", "--use-rope-scaling needs --position-embedding-type rope")
    if a.train_iters is not None:  # optimizer_param_scheduler: warm-up must fit in the decay span
        decay = a.lr_decay_iters or a.train_iters
        _check(a.lr_warmup_iters < decay, f"--lr-warmup-iters {a.lr_warmup_iters} >= decay iterations {decay}")
    _check(a.save_interval is None or a.save is not None, "--save-interval without --save")
    if a.fp8_format is not None:
        _check(a.transformer_impl == "transformer_engine", "fp8 needs --transformer-impl transformer_engine")


def _replay_fork_rules(a: argparse.Namespace) -> None:
    """The sail-sg/VocabularyParallelism fork's checks (its arguments.py L283-320, TRAINERS.md section 4)."""
    pp, tp = a.pipeline_model_parallel_size, a.tensor_model_parallel_size
    vpp = a.virtual_pipeline_model_parallel_size
    if a.enable_vocab_parallel:
        _check(pp > 1, "fork: --enable-vocab-parallel needs pipeline-model-parallel-size > 1")
        _check(vpp is None, "fork: --enable-vocab-parallel does not support virtual pipeline stages")
        _check(a.make_vocab_size_divisible_by % (tp * pp) == 0,
               f"fork: --make-vocab-size-divisible-by {a.make_vocab_size_divisible_by} must be a multiple of "
               f"tp*pp = {tp * pp} with --enable-vocab-parallel")
        _check(a.untie_embeddings_and_output_weights,
               "fork: --enable-vocab-parallel requires --untie-embeddings-and-output-weights")
    if a.enable_layer_redistribution:
        _check(pp > 1 and vpp is None, "fork: layer redistribution needs pp > 1 and no virtual pipeline stages")
        _check(a.final_stage_num_layers is not None and 0 <= a.final_stage_num_layers <= a.num_layers,
               "fork: --final-stage-num-layers must be in 0..num_layers")


def _transformer_config(a: argparse.Namespace):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch.bfloat16 if a.bf16 else torch.float16 if a.fp16 else torch.float32
    kw = dict(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        num_query_groups=a.num_query_groups if a.group_query_attention else None, kv_channels=a.kv_channels,
        ffn_hidden_size=a.ffn_hidden_size, tensor_model_parallel_size=a.tensor_model_parallel_size,
        pipeline_model_parallel_size=a.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=a.virtual_pipeline_model_parallel_size,
        context_parallel_size=a.context_parallel_size,
        cp_comm_type=a.cp_comm_type[0] if len(a.cp_comm_type) == 1 else a.cp_comm_type,
        sequence_parallel=a.sequence_parallel, pipeline_dtype=dtype, params_dtype=dtype, bf16=a.bf16, fp16=a.fp16,
        fp8=a.fp8_format, gated_linear_unit=a.swiglu, activation_func=F.silu if a.swiglu else F.gelu,
        add_bias_linear=a.add_bias_linear, add_qkv_bias=a.add_qkv_bias, normalization=a.normalization,
        hidden_dropout=a.hidden_dropout, attention_dropout=a.attention_dropout,
        layernorm_epsilon=a.norm_epsilon, init_method_std=a.init_method_std,
        num_layers_in_first_pipeline_stage=a.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=a.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=a.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=a.account_for_loss_in_pipeline_split,
        pipeline_model_parallel_layout=a.pipeline_model_parallel_layout,
        recompute_granularity=a.recompute_granularity, recompute_method=a.recompute_method,
        recompute_num_layers=a.recompute_num_layers, attention_backend=AttnBackend[a.attention_backend],
        bias_activation_fusion=a.bias_swiglu_fusion if a.swiglu else a.bias_gelu_fusion,
        masked_softmax_fusion=a.masked_softmax_fusion, bias_dropout_fusion=a.bias_dropout_fusion,
        cross_entropy_loss_fusion=a.cross_entropy_loss_fusion, cross_entropy_fusion_impl=a.cross_entropy_fusion_impl,
        # RoPE fusion is checked against the installed Transformer Engine, which a CPU machine lacks.
        apply_rope_fusion=False,
        overlap_p2p_comm=a.overlap_p2p_comm, batch_p2p_comm=not a.overlap_p2p_comm,
        microbatch_group_size_per_vp_stage=a.microbatch_group_size_per_virtual_pipeline_stage,
        qk_layernorm=a.qk_layernorm, mtp_num_layers=a.mtp_num_layers,
        mtp_loss_scaling_factor=a.mtp_loss_scaling_factor,
    )
    config_class = TransformerConfig
    if a.num_experts is not None:  # arguments.py moe_freq_type: an int or a Python list expression
        freq = a.moe_layer_freq
        kw.update(num_moe_experts=a.num_experts, moe_router_topk=a.moe_router_topk,
                  moe_ffn_hidden_size=a.moe_ffn_hidden_size,
                  moe_layer_freq=int(freq) if freq.isdigit() else eval(freq, {"__builtins__": {}}),  # noqa: S307
                  expert_model_parallel_size=a.expert_model_parallel_size,
                  expert_tensor_parallel_size=a.expert_tensor_parallel_size, moe_grouped_gemm=a.moe_grouped_gemm,
                  moe_token_dispatcher_type=a.moe_token_dispatcher_type,
                  moe_flex_dispatcher_backend=a.moe_flex_dispatcher_backend,
                  moe_router_score_function=a.moe_router_score_function,
                  moe_shared_expert_intermediate_size=a.moe_shared_expert_intermediate_size,
                  moe_router_enable_expert_bias=a.moe_router_enable_expert_bias,
                  moe_expert_capacity_factor=a.moe_expert_capacity_factor,
                  moe_pad_expert_input_to_capacity=a.moe_pad_expert_input_to_capacity,
                  moe_router_num_groups=a.moe_router_num_groups, moe_router_group_topk=a.moe_router_group_topk,
                  moe_router_topk_scaling_factor=a.moe_router_topk_scaling_factor,
                  overlap_moe_expert_parallel_comm=a.overlap_moe_expert_parallel_comm)
    if a.multi_latent_attention:
        from megatron.core.transformer.transformer_config import MLATransformerConfig
        config_class = MLATransformerConfig
        kw.update(multi_latent_attention=True, q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank,
                  qk_head_dim=a.qk_head_dim, qk_pos_emb_head_dim=a.qk_pos_emb_head_dim, v_head_dim=a.v_head_dim)
    try:
        return config_class(**kw)
    except (ValueError, AssertionError, TypeError) as exc:
        raise MegatronArgsError(f"TransformerConfig: {exc}") from exc


def _layers(a: argparse.Namespace, config) -> tuple[tuple[tuple[int, ...], ...], tuple[int, int], tuple[int, int]]:
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp, vpp = a.pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size or 1
    layout = config.pipeline_model_parallel_layout
    if layout is not None:
        grid = layout.layout  # [pp rank][vp stage] -> layer types
        find = lambda kind: next((r, v) for r in range(pp) for v in range(vpp) if kind in grid[r][v])  # noqa: E731
        return (tuple(tuple(grid[r][v].count(LayerType.decoder) for v in range(vpp)) for r in range(pp)),
                find(LayerType.embedding), find(LayerType.loss))
    try:
        layers = tuple(tuple(get_num_layers_to_build(config, vp_stage=v if vpp > 1 else None, pp_rank=r)
                             for v in range(vpp)) for r in range(pp))
    except AssertionError as exc:
        raise MegatronArgsError(f"get_num_layers_to_build: {exc}") from exc
    return layers, (0, 0), (pp - 1, vpp - 1)


def _optimizer_config(cls, a: argparse.Namespace, params_dtype):
    """megatron-core's OptimizerConfig of the flags. With the precision-aware optimizer its __post_init__ asserts
    adam and the distributed optimizer, then reads Transformer Engine's version and imports its FusedAdam, neither
    of which has a CPU build: with the version read as a current one (what the script targets), the import's
    failure, after every assertion has passed, is the CPU's pass."""
    from unittest import mock

    import torch

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    try:
        with mock.patch("megatron.core.optimizer.optimizer_config.is_te_min_version", return_value=True):
            return cls(optimizer="adam", lr=a.lr, min_lr=a.min_lr, weight_decay=a.weight_decay, bf16=a.bf16,
                       fp16=a.fp16, params_dtype=params_dtype, clip_grad=a.clip_grad,
                       use_distributed_optimizer=a.use_distributed_optimizer, fp8_recipe=a.fp8_recipe,
                       use_precision_aware_optimizer=a.use_precision_aware_optimizer,
                       main_grads_dtype=dtypes[a.main_grads_dtype], main_params_dtype=dtypes[a.main_params_dtype],
                       exp_avg_dtype=dtypes.get(a.exp_avg_dtype, torch.uint8),
                       exp_avg_sq_dtype=dtypes.get(a.exp_avg_sq_dtype, torch.uint8))
    except RuntimeError as exc:
        if a.use_precision_aware_optimizer and "requires FusedAdam from TransformerEngine" in str(exc):
            return None
        raise


def validate_args(argv: list[str] | tuple[str, ...], world_size: int, *, fork: bool = False,
                  tokenizer_vocab: int | None = None) -> Validated:
    """Parse, replay validate_args and build the megatron-core configs; raise MegatronArgsError on rejection.
    `fork`: parse as the sail-sg/VocabularyParallelism fork does (its flags, and its rules when they are given);
    its core 0.9 base is approximated by the megatron-core 0.16 checks. `tokenizer_vocab`: the entries of the
    tokenizer behind --tokenizer-model, for the padded vocabulary (None: padded_vocab is None)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.optimizer import OptimizerConfig

    a = parser(fork).parse_args(list(argv))
    _replay_validate_args(a, world_size)
    if fork:
        _replay_fork_rules(a)
    config = _transformer_config(a)
    try:
        n_micro = ConstantNumMicroBatchesCalculator(a.global_batch_size, a.micro_batch_size, a.data_parallel_size,
                                                    decrease_batch_size_if_needed=False, rank=0).get()
        ddp = DistributedDataParallelConfig(
            overlap_grad_reduce=a.overlap_grad_reduce, overlap_param_gather=a.overlap_param_gather,
            use_distributed_optimizer=a.use_distributed_optimizer, bucket_size=a.ddp_bucket_size,
            use_megatron_fsdp=a.use_megatron_fsdp, data_parallel_sharding_strategy=a.data_parallel_sharding_strategy,
            # validate_args: with --bf16, bf16 buffers with --grad-reduce-in-bf16, or with the precision-aware
            # optimizer's bf16 main gradients, fp32 otherwise (it forces accumulate_allreduce_grads_in_fp32); with
            # --fp16 the flag as given (default off: fp16 buffers)
            grad_reduce_in_fp32=a.accumulate_allreduce_grads_in_fp32 if a.fp16 else
            not (a.grad_reduce_in_bf16 or (a.use_precision_aware_optimizer and a.main_grads_dtype == "bf16")))
        _optimizer_config(OptimizerConfig, a, config.params_dtype)
        scheduler = _scheduler(a) if a.train_iters is not None else None
    except (ValueError, AssertionError) as exc:
        raise MegatronArgsError(f"megatron-core: {exc}") from exc
    vpp = a.virtual_pipeline_model_parallel_size or 1
    pp = a.pipeline_model_parallel_size
    if vpp > 1:  # schedules.py forward_backward_pipelining_with_interleaving (microbatch groups of pp)
        group = a.microbatch_group_size_per_virtual_pipeline_stage or pp
        _check(pp <= group <= n_micro, f"interleaved schedule: micro-batch group {group} must be in [pp {pp}, "
               f"micro-batches {n_micro}]")
        _check(n_micro % group == 0 or n_micro % group >= pp,
               f"interleaved schedule: {n_micro} micro-batches leave a last group smaller than pp {pp}")
    layers, emb, loss = _layers(a, config)
    _check(sum(map(sum, layers)) == a.num_layers, f"layers built {layers} do not sum to {a.num_layers}")
    if a.recompute_granularity == "full":
        per = (lambda n: n) if a.recompute_method == "uniform" else (lambda n: min(n, a.recompute_num_layers))
        recomputed = tuple(tuple(per(n) for n in rank) for rank in layers)
    else:
        recomputed = tuple(tuple(0 for _ in rank) for rank in layers)
    multiple = a.make_vocab_size_divisible_by * a.tensor_model_parallel_size
    vocab = (a.vocab_size + 1) if a.tokenizer_type == "NullTokenizer" else tokenizer_vocab
    padded = None if vocab is None else -(-vocab // multiple) * multiple
    return Validated(a, a.data_parallel_size, vpp, n_micro, padded, layers, emb, loss, recomputed, config, ddp,
                     scheduler)


def _scheduler(a: argparse.Namespace):
    """get_optimizer_param_scheduler (megatron/training/training.py) with --train-iters: steps counted in samples,
    decay over --lr-decay-iters (default --train-iters), constant weight decay."""
    from types import SimpleNamespace

    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    gbs = a.global_batch_size
    return OptimizerParamScheduler(
        SimpleNamespace(param_groups=[{"params": []}]), init_lr=0.0, max_lr=a.lr, min_lr=a.min_lr or 0.0,
        lr_warmup_steps=a.lr_warmup_iters * gbs, lr_decay_steps=(a.lr_decay_iters or a.train_iters) * gbs,
        lr_decay_style=a.lr_decay_style or "linear", start_wd=a.weight_decay, end_wd=a.weight_decay,
        wd_incr_steps=a.train_iters * gbs, wd_incr_style="constant")


def validate_launch(script: str, env: dict[str, str | None] | None = None, *, fork: bool = False,
                    tokenizer_vocab: int | None = None) -> tuple[Launch, Validated]:
    """Run the launch script (fake torchrun) and validate the pretrain_gpt.py arguments it passes (as the
    vocabulary-parallel fork would with `fork`)."""
    launch = run_launch_script(script, env)
    return launch, validate_args(launch.argv, launch.world_size, fork=fork, tokenizer_vocab=tokenizer_vocab)
