"""Megatron-LM `pretrain_gpt.py` arguments (a launch script or a file of arguments) read back into a Reading.

Flag names and defaults are Megatron-LM core_r0.16's (megatron/training/arguments.py; ../shared/TRAINERS.md
section 1): the inverse of autotune/emit/megatron.py, plus the spellings older scripts still use and Megatron
still accepts (`--recompute-activations`, `--num-layers-per-virtual-pipeline-stage`, `--use-flash-attn`,
`--use-rotary-position-embeddings`). Flags that do not change the plan (data, tokenizer files, optimizer,
logging, checkpoints, rotary base, norm epsilon...) are recognised and ignored; any other flag is reported in
the notes, never fatal. Megatron itself has no schedule flag: vpp > 1 means interleaved 1F1B, else 1F1B.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any

from autotune.check.bash import Shell, tokenize
from autotune.check.megatron_layout import check_layout, parse_layout
from autotune.check.megatron_moe_args import (MOE_NEUTRAL_SWITCH, MOE_NEUTRAL_VALUE, MOE_SWITCH, MOE_VALUE,
                                              capacity, dispatcher, mla_model_fields, moe_model_fields,
                                              routing_imbalance)
from autotune.check.megatron_notes import COSTED_OTHERWISE, QUALIFIERS, costed_otherwise_notes
from autotune.check.megatron_precision import (PRECISION_SWITCH, PRECISION_VALUE, cross_entropy, flash_attention,
                                               grad_reduce, optimizer_states)
from autotune.check.megatron_recompute import recompute_setting
from autotune.check.megatron_values import float_arg as _float, fraction_arg, int_arg as _int, window_fields
from autotune.check.overlaps import overlap_settings
from autotune.check.reading import Reading, check_sizes, misspelling_of
from autotune.check.script import launch_words, launcher_world
from autotune.errors import SpecError
from autotune.specs.limits import check_max
from autotune.specs.model import MAX_MTP_LAYERS

PROGRAM = "pretrain_gpt.py"
#: Flags that take one value and do not change the plan, the model shape or the cost (recognised, ignored).
NEUTRAL_VALUE = frozenset("""
--data-path --train-data-path --valid-data-path --test-data-path --split --data-cache-path --tokenizer-model
--vocab-file --merge-file --tokenizer-type --save --load --save-interval --log-interval --eval-interval
--eval-iters --train-iters --train-samples --lr --min-lr --lr-decay-style --lr-decay-iters --lr-decay-samples
--lr-warmup-iters --lr-warmup-samples --lr-warmup-fraction --lr-warmup-init --weight-decay --start-weight-decay
--end-weight-decay --weight-decay-incr-style --clip-grad --adam-beta1 --adam-beta2 --adam-eps --sgd-momentum
--optimizer --init-method-std --seed --rotary-base --rotary-percent --rotary-scaling-factor --norm-epsilon
--loss-scale --initial-loss-scale --min-loss-scale --loss-scale-window --hysteresis --distributed-backend
--distributed-timeout-minutes --tensorboard-dir --tensorboard-log-interval --tensorboard-queue-size
--wandb-project --wandb-exp-name --wandb-save-dir --ckpt-format --ckpt-fully-parallel-save --exit-interval
--exit-duration-in-mins --log-throughput --num-workers --dataloader-type --attention-softmax-in-fp32
--transformer-impl --cp-comm-type --ddp-num-buckets --num-distributed-optimizer-instances --eod-mask-loss
--empty-unused-memory-level
--rampup-batch-size --manual-gc-interval --timing-log-level --timing-log-option --rope-scaling-factor
--max-tokens-to-oom --fp8-recipe --fp8-margin
--fp8-amax-history-len --fp8-amax-compute-algo --tp-comm-overlap-cfg --logging-level --log-interval
--hidden-dropout --attention-dropout --ffn-hidden-size --distributed-timeout-seconds --ckpt-assume-constant-structure
--async-save --use-dist-ckpt --dist-ckpt-format --profile-ranks
--hierarchical-context-parallel-sizes --dist-ckpt-strictness --rerun-mode --profile-step-start --profile-step-end
""".split())
#: Switches (no value) that do not change the plan or its cost.
NEUTRAL_SWITCH = frozenset("""
--mock-data --use-mcore-models --no-load-optim --no-load-rng --no-save-optim --no-save-rng --finetune
--log-params-norm --log-num-zeros-in-grad --log-timers-to-tensorboard --log-memory-to-tensorboard
--log-validation-ppl-to-tensorboard --log-world-size-to-tensorboard --log-throughput --use-checkpoint-args
--no-gradient-accumulation-fusion --use-flash-attn --no-async-tensor-model-parallel-allreduce
--check-for-nan-in-loss-and-grad
--no-check-for-nan-in-loss-and-grad --apply-query-key-layer-scaling --no-position-embedding
--reset-position-ids --reset-attention-mask --eod-mask-loss --use-rotary-position-embeddings
--no-rope-fusion --no-bias-swiglu-fusion --no-bias-gelu-fusion --no-persist-layer-norm --manual-gc
--no-create-attention-mask-in-dataloader --use-rope-scaling --calculate-per-token-loss --use-cpu-initialization
--ckpt-fully-parallel-load --async-save --deterministic-mode
--tp-comm-overlap-disable-qkv --tp-comm-bulk-dgrad --tp-comm-bulk-wgrad --disable-tp-comm-split-ag
--disable-tp-comm-split-rs --no-mmap-bin-files --fp8-wgrad --exit-on-missing-checkpoint --bf16-grad-reduce
--exit-signal-handler --profile --align-param-gather --delay-wgrad-compute --enable-cuda-graph --use-tp-pp-dp-mapping
""".split())
#: Flags that take one value and that this reader uses.
VALUE = frozenset("""
--num-layers --hidden-size --ffn-hidden-size --num-attention-heads --kv-channels --num-query-groups
--seq-length --max-position-embeddings --position-embedding-type --normalization --vocab-size
--make-vocab-size-divisible-by --tokenizer-type --attention-dropout --hidden-dropout --tensor-model-parallel-size
--model-parallel-size --pipeline-model-parallel-size --context-parallel-size --num-virtual-stages-per-pipeline-rank
--num-layers-per-virtual-pipeline-stage --virtual-pipeline-model-parallel-size --decoder-first-pipeline-num-layers
--decoder-last-pipeline-num-layers --pipeline-model-parallel-layout --micro-batch-size --global-batch-size
--recompute-granularity --recompute-method --recompute-num-layers --recompute-modules --ddp-bucket-size
--data-parallel-sharding-strategy --microbatch-group-size-per-virtual-pipeline-stage --window-size
--window-attn-skip-freq --fp8-format --attention-backend --expert-model-parallel-size --num-experts
--expert-tensor-parallel-size --moe-router-topk --moe-ffn-hidden-size --moe-router-score-function
--moe-shared-expert-intermediate-size --moe-token-dispatcher-type --moe-flex-dispatcher-backend
""".split())
#: Switches this reader uses.
SWITCH = frozenset("""
--group-query-attention --swiglu --untie-embeddings-and-output-weights --disable-bias-linear --add-qkv-bias
--sequence-parallel --tp-comm-overlap --bf16 --fp16 --fp8-hybrid --use-distributed-optimizer --use-megatron-fsdp
--use-custom-fsdp --fp8-param-gather
--use-torch-fsdp2 --recompute-activations --checkpoint-activations
--no-masked-softmax-fusion --no-bias-dropout-fusion --enable-vocab-parallel --account-for-embedding-in-pipeline-split
--account-for-loss-in-pipeline-split --squared-relu --distribute-saved-activations --qk-layernorm
--overlap-grad-reduce --overlap-param-gather --no-overlap-p2p-communication --overlap-p2p-communication-warmup-flush
""".split())
VALUE, SWITCH = VALUE | MOE_VALUE | PRECISION_VALUE, SWITCH | MOE_SWITCH | PRECISION_SWITCH  # megatron_moe/precision
NEUTRAL_VALUE, NEUTRAL_SWITCH = NEUTRAL_VALUE | MOE_NEUTRAL_VALUE, NEUTRAL_SWITCH | MOE_NEUTRAL_SWITCH
#: Value flags that take a list (argparse nargs='*').
LIST_VALUE = {"--recompute-modules"}
#: Old spellings Megatron still accepts, and what they mean here.
DEPRECATED = {
    "--model-parallel-size": "--tensor-model-parallel-size",
    "--virtual-pipeline-model-parallel-size": "--num-virtual-stages-per-pipeline-rank",
    "--recompute-activations": "--recompute-granularity selective",
    "--checkpoint-activations": "--recompute-granularity full --recompute-method uniform",
    "--use-flash-attn": "--attention-backend flash",
    "--use-rotary-position-embeddings": "--position-embedding-type rope",
    "--moe-enable-deepep": "--moe-flex-dispatcher-backend deepep",
    "--use-custom-fsdp": "--use-megatron-fsdp",  # its name before megatron-core 0.14
}
#: Every flag the reader knows, for telling a slip of one from a flag it does not (reading.misspelling_of).
#: Flags read for their notes only (megatron_notes.py), with any values they have.
OTHERWISE = frozenset(COSTED_OTHERWISE) | frozenset(QUALIFIERS)
KNOWN_FLAGS = frozenset(VALUE | SWITCH | LIST_VALUE | NEUTRAL_VALUE | NEUTRAL_SWITCH | OTHERWISE | set(DEPRECATED))


def read_megatron(text: str) -> Reading:
    """A launch script (the words after its pretrain_gpt.py) or a plain file of arguments."""
    first = next((w for w in tokenize(text) if not isinstance(w, str)), None)
    if first is not None and first.raw.startswith("--"):
        shell = Shell()  # a file of arguments: expand defaults, nothing to run
        argv = [w for word in tokenize(text) if not isinstance(word, str) for w in shell.expand(word)]
        notes = list(shell.notes)
    else:
        shell = Shell()
        argv, notes = launch_words(text, lambda w: os.path.basename(w) == PROGRAM, PROGRAM, shell)
        return replace(reading_from_args(argv, notes), launch=launcher_world(shell.launcher))
    return reading_from_args(argv, notes)


def parse_args(argv: list[str], notes: list[str]) -> dict[str, Any]:
    """Flags -> values (True for switches; the last occurrence wins, as in argparse); notes for the rest."""
    args: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        flag, _, inline = word.partition("=")
        if not flag.startswith("--"):
            notes.append(f"stray argument {word!r} ignored")
            i += 1
            continue
        if flag in DEPRECATED:
            notes.append(f"{flag} is a deprecated spelling of {DEPRECATED[flag]}; read as that")
        if flag in SWITCH:
            args[flag], i = True, i + 1
            if DEPRECATED.get(flag) in SWITCH:  # a renamed switch: every reader sees the current name
                args[DEPRECATED[flag]] = True
        elif flag in NEUTRAL_VALUE or flag in NEUTRAL_SWITCH or flag in OTHERWISE:  # any values go with it
            args[flag], i = inline or True, i + 1
            while i < len(argv) and not argv[i].startswith("--"):
                args[flag], i = argv[i], i + 1
        elif flag in LIST_VALUE:  # nargs='*': every word up to the next flag
            values, i = ([inline] if inline else []), i + 1
            while i < len(argv) and not argv[i].startswith("--"):
                values, i = values + [argv[i]], i + 1
            args[flag] = " ".join(values)
        elif flag in VALUE:
            if inline:
                args[flag], i = inline, i + 1
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                args[flag], i = argv[i + 1], i + 2
            else:  # most often a variable the script never sets: autotune reads it with an empty environment
                block = next((n.split("`")[1] for n in notes if "block is not followed" in n), None)
                raise SpecError(f"{flag} has no value; if the script gives it from a variable, set the variable in "
                                "the script (${TP:-8} or : ${TP:=8}): autotune reads it with an empty environment"
                                + (f", and does not follow the script's `{block}` block" if block else ""))
        else:
            meant = misspelling_of(flag, KNOWN_FLAGS)
            if meant is not None:
                raise SpecError(f"unknown flag {flag}: pretrain_gpt.py refuses arguments it does not define "
                                f"(argparse, allow_abbrev=False); did you mean {meant}?")
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            notes.append(f"unknown flag {flag} ignored (not a pretrain_gpt.py flag autotune knows; it does not "
                         "change the plan as read)")
            i = j
    return args


def _refuse(flag: str, value: Any, choices: str) -> Any:
    raise SpecError(f"{flag} {value}: Megatron-LM takes {choices}")


def reading_from_args(argv: list[str], notes: list[str]) -> Reading:
    args = parse_args(argv, notes)
    costed_otherwise_notes(args, notes)
    tp = _int(args, "--tensor-model-parallel-size", _int(args, "--model-parallel-size", 1))
    pp = _int(args, "--pipeline-model-parallel-size", 1)
    cp = _int(args, "--context-parallel-size", 1)
    model = _model(args, notes)
    check_sizes("pretrain_gpt.py arguments", degrees=(tp or 1, pp or 1, cp or 1),
                layers=model["num_layers"] if model else None)
    layers, vpp, split, extra = _partition(args, pp, model["num_layers"] if model else None, notes)
    granularity = args.get("--recompute-granularity")
    if args.get("--recompute-activations"):
        granularity = granularity or "selective"
    if args.get("--checkpoint-activations"):
        granularity = granularity or "full"
    recompute, recompute_layers = recompute_setting(granularity, args, notes, _int)
    zero = 0
    if args.get("--use-distributed-optimizer"):
        zero = 1
    if args.get("--use-megatron-fsdp"):
        strategy = args.get("--data-parallel-sharding-strategy", "optim_grads_params")
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(strategy, 3)
    if args.get("--use-torch-fsdp2"):
        zero = 3
    _overlap_rules(args, tp or 1)
    if args.get("--fp16") and args.get("--bf16"):
        raise SpecError("--fp16 and --bf16: Megatron trains in one of them (validate_args); drop one")
    dtype = "fp16" if args.get("--fp16") else "bf16"
    if "--fp8-format" in args or args.get("--fp8-hybrid"):
        dtype = "fp8"
    return Reading(
        trainer="megatron", tp=tp or 1, pp=pp or 1, cp=cp or 1,
        ep=_int(args, "--expert-model-parallel-size", 1) or 1, etp=_int(args, "--expert-tensor-parallel-size"),
        mbs=_int(args, "--micro-batch-size", 1) or 1, global_batch=_int(args, "--global-batch-size"),
        seq_len=_int(args, "--seq-length"), vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b",
        recompute=recompute, recompute_layers=recompute_layers, zero=zero,
        sequence_parallel=bool(args.get("--sequence-parallel")) and (tp or 1) > 1,
        tp_overlap=bool(args.get("--tp-comm-overlap")), vocab_parallel=bool(args.get("--enable-vocab-parallel")),
        layers_per_stage=layers, split=split, split_extra=extra, bucket_size=_int(args, "--ddp-bucket-size"),
        dtype=dtype, fp32=not args.get("--bf16") and dtype == "bf16", flash_attention=flash_attention(args, notes),
        fused_kernels=not (args.get("--no-masked-softmax-fusion") or args.get("--no-bias-dropout-fusion")),
        grad_reduce=grad_reduce(args), optimizer_states=optimizer_states(args, notes),
        moe_dispatcher=dispatcher(args, notes), cross_entropy=cross_entropy(args, notes),
        **overlap_settings(args, zero, vpp),
        moe_imbalance=routing_imbalance(args), moe_capacity=capacity(args, _float), model_fields=model,
        model_soft=_soft(args), notes=tuple(notes), vocab_divisor=_int(args, "--make-vocab-size-divisible-by", 128),
        shard_replicas=(_int(args, "--num-distributed-optimizer-instances", 1) or 1) if zero == 1 else 1)


def _overlap_rules(args: dict[str, Any], tp: int) -> None:
    """validate_args' refusals of overlap and activation-distribution switches (TRAINERS.md 1.2)."""
    if args.get("--overlap-param-gather"):
        if not (args.get("--use-distributed-optimizer") or args.get("--use-megatron-fsdp")):
            raise SpecError("--overlap-param-gather without --use-distributed-optimizer: Megatron refuses it "
                            "(validate_args); add --use-distributed-optimizer or drop --overlap-param-gather")
        if not args.get("--overlap-grad-reduce"):
            raise SpecError("--overlap-param-gather without --overlap-grad-reduce: Megatron refuses it "
                            "(validate_args); add --overlap-grad-reduce or drop --overlap-param-gather")
    legacy = bool(args.get("--checkpoint-activations"))  # sets full granularity and the uniform method
    full = legacy or args.get("--recompute-granularity") == "full"
    if args.get("--distribute-saved-activations") and (tp == 1 or not full or not (
            legacy or "--recompute-method" in args)):
        raise SpecError("--distribute-saved-activations: Megatron takes it only with tp > 1, --recompute-granularity "
                        "full and a --recompute-method (validate_args); add them or drop it")


def _model(args: dict[str, Any], notes: list[str]) -> dict[str, Any] | None:
    """The model shape the flags define (Megatron's defaults where a flag is absent), or None without
    --num-layers/--hidden-size/--num-attention-heads."""
    need = ("--num-layers", "--hidden-size", "--num-attention-heads")
    if not all(flag in args for flag in need):
        return None
    h, heads = _int(args, "--hidden-size"), _int(args, "--num-attention-heads")
    assert h is not None and heads is not None
    gated = bool(args.get("--swiglu"))
    # Megatron's default FFN width: 4h, or for SwiGLU int(4h * 2/3 / 64) * 64 (TransformerConfig)
    ffn = _int(args, "--ffn-hidden-size", int(4 * h * 2 / 3 / 64) * 64 if gated else 4 * h)
    kv = _int(args, "--num-query-groups", heads) if args.get("--group-query-attention") else heads
    position = args.get("--position-embedding-type", "rope" if args.get("--use-rotary-position-embeddings")
                        else "learned_absolute")
    if position not in ("rope", "learned_absolute", "none"):  # none: no op and no weights, as ALiBi is costed
        notes.append(f"--position-embedding-type {position}: costed as rope (no learned table)")
    fields: dict[str, Any] = {
        "num_layers": _int(args, "--num-layers"), "hidden_size": h, "num_heads": heads, "num_kv_heads": kv,
        "head_dim": _int(args, "--kv-channels", h // heads), "ffn_hidden_size": ffn,
        "activation": "swiglu" if gated else "gelu",
        "norm": {"RMSNorm": "rmsnorm", "LayerNorm": "layernorm"}.get(args.get("--normalization", "LayerNorm"))
        or _refuse("--normalization", args["--normalization"], "LayerNorm or RMSNorm (argparse choices)"),
        "tied_embeddings": not args.get("--untie-embeddings-and-output-weights"),
        "bias": ("qkv" if args.get("--add-qkv-bias") else "none") if args.get("--disable-bias-linear") else "all",
        "dropout": _float(args, "--attention-dropout", 0.1) > 0 or _float(args, "--hidden-dropout", 0.1) > 0,
        "causal": True, "position_embedding": {"learned_absolute": "learned", "none": "alibi"}.get(position, "rope"),
        "qk_norm": bool(args.get("--qk-layernorm")),
        "max_position_embeddings": (_int(args, "--max-position-embeddings", 0) or 0)
        if position == "learned_absolute" else 0,
    }
    experts = _int(args, "--num-experts", 0) or 0
    fields["num_experts"] = experts  # 0: dense, which no MoE catalog model matches
    if experts:  # mixture of experts (Megatron's --moe-* flags; megatron_moe_args.py)
        fields.update(num_experts=experts, moe_top_k=_int(args, "--moe-router-topk", 2),
                      moe_ffn_hidden_size=_int(args, "--moe-ffn-hidden-size", ffn),
                      router=args.get("--moe-router-score-function", "softmax"),
                      **moe_model_fields(args, fields["num_layers"], experts, notes, _int))
        if fields["moe_top_k"] > experts:
            raise SpecError(f"--moe-router-topk {fields['moe_top_k']} exceeds --num-experts {experts}: a token is "
                            "routed to at most every expert; lower it")
        if fields["router_bias"] and fields["router"] != "sigmoid":
            raise SpecError("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (megatron-core "
                            "refuses it with softmax); add it, or drop the bias")
        if shared := _int(args, "--moe-shared-expert-intermediate-size", 0):
            fields.update(num_shared_experts=1, shared_expert_ffn_hidden_size=shared)
    fields.update(mla_model_fields(args, _int, notes), **window_fields(args, fields["num_layers"]))
    fields["mtp_layers"] = check_max(_int(args, "--mtp-num-layers", 0) or 0, MAX_MTP_LAYERS, "--mtp-num-layers")
    if args.get("--tokenizer-type") == "NullTokenizer" and "--vocab-size" in args:
        fields["vocab_size"] = (_int(args, "--vocab-size") or 0) + 1  # NullTokenizer adds the EOD token
    elif "--vocab-size" in args:
        notes.append(f"--vocab-size {args['--vocab-size']}: only Megatron's NullTokenizer reads it; the tokenizer "
                     "sets the vocabulary, so the model's is costed (give --model to name it)")
    if args.get("--squared-relu"):
        notes.append("--squared-relu: costed as GeLU (same two-matrix MLP)")
    return fields


def _soft(args: dict[str, Any]) -> dict[str, Any]:
    """Model settings that do not change the cost, where the flags give them."""
    soft: dict[str, Any] = {}
    for flag, key in (("--rotary-base", "rope_theta"), ("--norm-epsilon", "norm_eps"),
                      ("--init-method-std", "init_std"), ("--rope-scaling-factor", "rope_scaling_factor"),
                      ("--moe-router-topk-scaling-factor", "moe_router_scaling"),
                      ("--rotary-percent", "rotary_fraction")):
        if isinstance(args.get(flag), str):
            soft[key] = fraction_arg(args, flag) if key == "rotary_fraction" else _float(args, flag, 0.0)
    if args.get("--use-rope-scaling"):
        soft["rope_scaling"] = "llama3"
    return soft


def _partition(args: dict[str, Any], pp: int | None, num_layers: int | None,
               notes: list[str]) -> tuple[tuple[int, ...] | None, int, str, tuple[int, ...]]:
    """(layers per rank or None for the split rule, vpp, split rule, its extra layers) from the pipeline flags."""
    pp = pp or 1
    layout = args.get("--pipeline-model-parallel-layout")
    if layout is not None:
        stages = parse_layout(layout)
        if len(stages) % pp:
            raise SpecError(f"--pipeline-model-parallel-layout has {len(stages)} stages, not a multiple of "
                            f"--pipeline-model-parallel-size {pp}; give pp x vpp stages")
        check_layout(layout, pp, _int(args, "--mtp-num-layers", 0) or 0, notes)
        vpp = len(stages) // pp
        layers = tuple(sum(stages[j] for j in range(rank, len(stages), pp)) for rank in range(pp))
        chunks = [[stages[j] for j in range(rank, len(stages), pp)] for rank in range(pp)]
        if any(c != sorted(c, reverse=True) or max(c) - min(c) > 1 for c in chunks):
            notes.append(f"layout {layout}: chunks of a rank differ by more than the even split autotune costs; "
                         "costed with each rank's layers split evenly over its chunks")
        return layers, vpp, "even", ()
    vpp = _int(args, "--num-virtual-stages-per-pipeline-rank") or _int(args, "--virtual-pipeline-model-parallel-size")
    per_chunk = _int(args, "--num-layers-per-virtual-pipeline-stage")
    first, last = _int(args, "--decoder-first-pipeline-num-layers"), _int(args, "--decoder-last-pipeline-num-layers")
    emb, loss = (1 if args.get("--account-for-embedding-in-pipeline-split") else 0,
                 1 if args.get("--account-for-loss-in-pipeline-split") else 0)
    if per_chunk and vpp:
        raise SpecError("--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank: "
                        "Megatron takes one of them (validate_args); drop one")
    if per_chunk and (first is not None or last is not None):
        raise SpecError("--num-layers-per-virtual-pipeline-stage cannot be combined with "
                        "--decoder-first/last-pipeline-num-layers (validate_args); use --num-virtual-stages-per-"
                        "pipeline-rank")
    if per_chunk and num_layers:
        per_rank = (num_layers + emb + loss) // pp
        if (num_layers + emb + loss) % pp:
            extra = f" + {emb + loss} (embedding/loss)" if emb + loss else ""
            raise SpecError(f"--num-layers {num_layers}{extra} does not split over --pipeline-model-parallel-size {pp} "
                            "(TransformerConfig); give a pp that divides it, or uneven first/last stages")
        if per_rank % per_chunk:
            raise SpecError(f"--num-layers-per-virtual-pipeline-stage {per_chunk}: the {per_rank} layers of a "
                            "pipeline stage are not a multiple of it (validate_args); give a divisor of "
                            f"{per_rank}")
        vpp = per_rank // per_chunk
    vpp = vpp or 1
    if (first is not None or last is not None) and num_layers is not None:
        ends = (first or 0) + (last or 0)
        middle_ranks = pp - (first is not None) - (last is not None)
        rest = num_layers - ends
        if rest < 0 or (middle_ranks and rest % middle_ranks) or (not middle_ranks and rest):
            raise SpecError(f"--decoder-first/last-pipeline-num-layers {first}/{last}: the other {rest} of "
                            f"--num-layers {num_layers} do not split evenly over {middle_ranks} middle stage(s)")
        mid = rest // middle_ranks if middle_ranks else 0
        layers = [mid] * pp
        if first is not None:
            layers[0] = first
        if last is not None:
            layers[-1] = last
        for n in sorted(set(layers)):
            _check_chunks(n, vpp)
        return tuple(layers), vpp, "even", ()
    if num_layers is not None and (num_layers + emb + loss) % pp == 0:
        _check_chunks((num_layers + emb + loss) // pp, vpp)
    if emb or loss:
        return None, vpp, "account", (emb, loss)
    return None, vpp, "even", ()


def _check_chunks(per_rank: int, vpp: int) -> None:
    """megatron-core builds a rank's layers // vpp per virtual stage, asserting that they divide
    (transformer_block.get_num_layers_to_build); the explicit layout is the way to uneven chunks."""
    if vpp > 1 and per_rank % vpp:
        raise SpecError(f"{per_rank} layers on a pipeline rank do not split over its {vpp} virtual stages "
                        "(megatron-core asserts they divide); change the virtual stages or give "
                        "--pipeline-model-parallel-layout")


def vocab_padded(vocab: int, tp: int, divisor: int) -> int:
    """Megatron's padded vocabulary: a multiple of make_vocab_size_divisible_by x tp."""
    return math.ceil(vocab / (divisor * tp)) * divisor * tp
