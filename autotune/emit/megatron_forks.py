"""What mainline Megatron-LM lacks, for the Megatron-LM emitter (../shared/TRAINERS.md sections 1.1 and 4).

* Zero-bubble ZB-H1 and V-Half (Qi et al., ICLR 2024 and "Pipeline parallelism with controllable memory", 2024)
  live in the sail-sg/zero-bubble-pipeline-parallelism fork, whose flags are not recorded in TRAINERS.md: no flag
  is emitted (none invented); the plan runs as 1F1B over the same layers per rank, with a warning.
* Vocabulary parallelism (Yeung et al. 2024) lives in the sail-sg/VocabularyParallelism fork (HEAD 6191c3b, a
  fork of Megatron-LM core 0.9): `--enable-vocab-parallel`, which mainline rejects. The launch script keeps it in
  a FORK_ARGS array, on by default (the plan as planned; on mainline it fails at once instead of silently running
  another placement) and emptied by VOCAB_PARALLEL=0, the switch the fork's own launcher uses, to run on mainline
  with the vocabulary layers on the end stages. The fork's other rules (pp > 1, no VPP, untied embeddings,
  make_vocab_size_divisible_by % (tp*pp) == 0) are met by mainline flags, so nothing else differs.
"""

from __future__ import annotations

from dataclasses import replace

from autotune.emit.common import commented
from autotune.emit.quote import bash_word
from autotune.specs.plan import Plan

#: The fork that implements vocabulary parallelism (paper: Yeung et al. 2024), at the commit TRAINERS.md read.
VOCAB_FORK = "sail-sg/VocabularyParallelism"
VOCAB_FORK_HEAD = "6191c3b"
#: Flags only that fork accepts (its arguments.py); mainline Megatron-LM rejects them as unrecognized.
VOCAB_FORK_FLAGS = ("--enable-vocab-parallel",)
#: Where the ZB-H1 and V-Half schedules live (Qi et al. 2024); its flags are not recorded in TRAINERS.md.
ZB_FORK = "sail-sg/zero-bubble-pipeline-parallelism"

Flag = tuple[str, str | None]


def mainline_plan(plan: Plan) -> Plan:
    """The plan as mainline Megatron-LM runs it: zb-h1 and v-half become 1F1B over the same layers per rank
    (one model chunk each); other plans are unchanged."""
    if plan.schedule in ("zb-h1", "v-half"):
        return replace(plan, schedule="1f1b", vpp=1)
    return plan


def fork_flags(plan: Plan) -> list[Flag]:
    """Flags of the sail-sg/VocabularyParallelism fork (TRAINERS.md section 4) the plan needs; the fork's other
    requirements (untied embeddings, make_vocab_size_divisible_by % (tp*pp) == 0, pp > 1, no VPP) are met by the
    mainline flags."""
    return [(flag, None) for flag in VOCAB_FORK_FLAGS] if plan.vocab == "parallel" else []


def schedule_warnings(plan: Plan) -> list[str]:
    """One line for each thing of the plan mainline Megatron-LM cannot run: its schedule, vocabulary parallelism."""
    layers = ",".join(map(str, plan.layers_per_stage))
    not_recorded = f"the {ZB_FORK} fork, whose flags autotune has not recorded, so none are emitted"
    out = []
    if plan.schedule == "zb-h1":
        out.append(f"schedule zb-h1: mainline Megatron-LM has no zero-bubble schedule (ZB-H1 is in {not_recorded});"
                   f" emitted 1F1B with the same layers per rank ({layers}): no more activation memory (ZB-H1 "
                   "keeps weight-gradient inputs longer), but a larger bubble (weight gradients are not deferred "
                   "into it)")
    elif plan.schedule == "v-half":
        out.append(f"schedule v-half: mainline Megatron-LM has no V-shaped schedule (V-Half is in {not_recorded}); "
                   f"emitted 1F1B with the same layers per rank ({layers}), one chunk each: the LM head moves from "
                   f"rank 0 to rank {plan.pp - 1}, the bubble is larger and the activation memory about twice the "
                   "V-Half prediction")
    if plan.vocab == "parallel":
        out.append(f"vocab parallel: only the {VOCAB_FORK} fork of Megatron-LM (HEAD {VOCAB_FORK_HEAD}, based on "
                   "core 0.9) has vocabulary parallelism; the script passes --enable-vocab-parallel (FORK_ARGS), "
                   "which mainline Megatron-LM rejects: run it from the fork, or with VOCAB_PARALLEL=0 on mainline "
                   "(embedding on the first stage, LM head on the last: more memory there and a slower step than "
                   "predicted)")
        if plan.schedule == "v-half":
            out.append(f"vocab parallel with v-half: {VOCAB_FORK} runs vocabulary parallelism with 1F1B only; V-Half "
                       f"with it is on branch v-half-vocab of {ZB_FORK}, whose flags are not recorded (none emitted)")
    return out


def fork_block(p: Plan, divisor: str | None, *, mainline: bool = False) -> str:
    """The launch script's FORK_ARGS: the vocabulary-parallel fork's flags, on by default, emptied by
    VOCAB_PARALLEL=0 (so that the script also runs on mainline); "" when the plan needs none. `divisor` is the
    script's --make-vocab-size-divisible-by; `mainline`: the script has a MAINLINE_ARGS array (flags newer than
    the fork's core 0.9), emptied when the fork's flags are on."""
    flags = fork_flags(p)
    if not flags:
        return ""
    notes = [
        f"---- vocabulary parallelism: {VOCAB_FORK} fork of Megatron-LM only (HEAD {VOCAB_FORK_HEAD}) ----",
        f"The plan splits the embedding and the LM head evenly over all {p.pp} pipeline ranks (Yeung et al. 2024).",
        "Only the fork has that: run this script from a checkout of it (MEGATRON_LM=...). Mainline Megatron-LM",
        "rejects these flags (unrecognized arguments): VOCAB_PARALLEL=0 leaves them out, and the script then runs",
        "on mainline with the embedding on the first stage and the LM head on the last (more memory there and a",
        "slower step than predicted).",
        "The fork also requires --untie-embeddings-and-output-weights (GPT_ARGS), pp > 1, no virtual pipeline",
        f"stages and --make-vocab-size-divisible-by a multiple of tp*pp = {p.tp * p.pp} "
        f"(DATA_ARGS: {divisor}): all set.",
        "Add --disable-backward-fusion for the paper's Vocab-2 variant (2 all-reduce barriers; activation memory",
        "p+1 instead of p+2). The fork is based on Megatron-LM core 0.9, whose arguments.py lacks",
        "--attention-backend and --cp-comm-type: those are in MAINLINE_ARGS, passed only with VOCAB_PARALLEL=0.",
    ]
    body = "".join(f"    FORK_ARGS+=({bash_word(flag)})\n" for flag, _ in flags)
    if mainline:
        body += "    MAINLINE_ARGS=()\n"
    return (commented(notes) + 'VOCAB_PARALLEL="${VOCAB_PARALLEL:-1}"\nFORK_ARGS=()\n'
            'if [[ "$VOCAB_PARALLEL" != 0 ]]; then\n' + body + "fi\n\n")
