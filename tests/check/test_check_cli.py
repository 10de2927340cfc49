"""`autotune check` end to end: the estimate JSON equals `estimate --json` byte for byte, hand-written variants
read as the emitted script does, exit 4 (gap) and 5 (out of memory), GitHub annotations, --emit-better, and
bad input (one `error:` line, exit 1, nothing written)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.emit import emit
from autotune.errors import InvalidPlanError, SpecError
from emit.scenarios import GOLDEN  # tests/emit

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama3-70b-tp8-pp4.sh"

#: llama3-8b as a file of pretrain_gpt.py arguments; PARALLEL is replaced per test.
ARGS = """\
# pretrain_gpt.py arguments, one group a line
--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192
--position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights
--disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0
--tokenizer-type NullTokenizer --vocab-size 128255
PARALLEL
--micro-batch-size 1 --global-batch-size 64 --bf16
"""


#: Llama-3-8B's shape as Megatron-LM flags (for --model llama3-8b), and a hand-written interleaved script of it (tp 2,
#: pp 4, vpp 4, the distributed optimizer, 32 GPUs) that the overlap tests vary flag by flag
LLAMA_8B_SHAPE = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336 "
                  "--group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 "
                  "--normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear "
                  "--position-embedding-type rope --attention-dropout 0.0 --hidden-dropout 0.0 ")
INTERLEAVED_8B = ("#!/bin/bash\npython pretrain_gpt.py --bf16 --micro-batch-size 1 --global-batch-size 64 "
                  "--use-distributed-optimizer --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                  "--num-layers-per-virtual-pipeline-stage 2 --sequence-parallel " + LLAMA_8B_SHAPE)


def _write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def _emitted(tmp: Path, scenario: str, trainer: str, fmt: str = "cli") -> Path:
    for name, content in emit(trainer, GOLDEN[scenario], torchtitan_format=fmt).files:
        (tmp / name).write_text(content)
    return tmp


def _check_json(cli, *args: str) -> tuple[dict, int]:
    result = cli("check", *args, "--json")
    return json.loads(result.stdout), result.exit_code


# ------------------------------------------------------------------------------------------ byte-identical estimate
@pytest.mark.parametrize("trainer,config,fmt", [("megatron", "launch_megatron.sh", "cli"),
                                                ("torchtitan", "torchtitan.toml", "toml"),
                                                ("deepspeed", "ds_config.json", "cli")])
def test_estimate_json_is_estimates(cli, tmp_path: Path, trainer: str, config: str, fmt: str) -> None:
    """`check --json` minus its "check" object is, to the byte, `estimate --plan <the plan read> --json` of the
    same job with the trainer's kernels."""
    inp = GOLDEN["even"]
    path = _emitted(tmp_path, "even", trainer, fmt) / config
    extra = ["--model", "llama3-8b", "--seq-len", "8192"] if trainer == "deepspeed" else []
    doc, code = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "16", *extra)
    assert code == 0
    check = doc.pop("check")
    assert check["trainer"] == trainer
    plan_file = _write(tmp_path, "plan.json", json.dumps(doc["plan"]))
    job = doc["job"]
    est = cli("estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch",
              str(job["global_batch"]), "--seq-len", str(job["seq_len"]), "--dtype", job["dtype"], "--plan",
              str(plan_file), "--kernels", trainer, "--json")
    assert est.exit_code == 0
    assert json.dumps(doc, indent=2) == est.stdout.rstrip("\n")
    assert doc["plan"]["tp"] == inp.plan.tp and doc["plan"]["pp"] == inp.plan.pp


# ------------------------------------------------------------------------------------------ hand-written variants
def _plan_of(cli, path: Path, gpus: str = "16") -> dict:
    doc, _ = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", gpus)
    return doc["plan"]


def test_variants_read_as_the_emitted_script(cli, tmp_path: Path) -> None:
    """Reordered flags, comments, env-var defaults, deprecated spellings, = forms and continuations."""
    emitted = _plan_of(cli, _emitted(tmp_path, "even", "megatron") / "launch_megatron.sh")
    variant = _write(tmp_path, "variant.sh", """#!/bin/bash
# a hand-written launch of the same plan
TP=${TP:-2}; PP="${PP:-2}"   # defaults, as the job runs them
export SEQ=${SEQ_LEN:-8192}
if [ -n "$DEBUG_FLAGS" ]; then
    EXTRA=(--tensor-model-parallel-size 8)
fi
ARGS=(--bf16 --recompute-activations)   # --recompute-activations: the old spelling of selective
ARGS+=(--use-distributed-optimizer)
python -u pretrain_gpt.py --micro-batch-size=1 --global-batch-size 64 \\
  --pipeline-model-parallel-size $PP --model-parallel-size "$TP" --sequence-parallel \\
  --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336 \\
  --seq-length $SEQ --max-position-embeddings $SEQ --use-rotary-position-embeddings \\
  --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear \\
  --group-query-attention --num-query-groups 8 --attention-dropout 0.0 --hidden-dropout 0.0 \\
  --tokenizer-type NullTokenizer --vocab-size 128255 --rotary-base 500000 --norm-epsilon 1e-5 \\
  --use-flash-attn --some-new-flag 3 "${ARGS[@]}" "${EXTRA[@]}" "$@"
""")
    assert _plan_of(cli, variant) == emitted
    result = cli("check", str(variant), "--gpu", "h100-sxm", "--gpus", "16")
    assert "unknown flag --some-new-flag ignored" in result.stdout
    assert "--recompute-activations is a deprecated spelling" in result.stdout


def test_uneven_and_layout_spellings(cli, tmp_path: Path) -> None:
    """first/last, an explicit layout and account-for-* give the layers Megatron builds."""
    cases = {
        "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 6":
            [6, 10, 10, 6],
        "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*12|t*20L'": [12, 20],
        "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'E(t*4|)*2t*12|t*12L'": [16, 16],
        "--pipeline-model-parallel-size 2 --account-for-embedding-in-pipeline-split "
        "--account-for-loss-in-pipeline-split": [16, 16],
        "--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2": [8, 8, 8, 8],
    }
    for parallel, layers in cases.items():
        plan = _plan_of(cli, _write(tmp_path, "args.txt", ARGS.replace("PARALLEL", parallel)))
        assert plan["layers_per_stage"] == layers, parallel


def test_torchtitan_overrides_with_model(cli, tmp_path: Path) -> None:
    overrides = _emitted(tmp_path, "even", "torchtitan") / "torchtitan_overrides.txt"
    doc, code = _check_json(cli, str(overrides), "--trainer", "torchtitan", "--gpu", "h100-sxm", "--gpus", "16",
                            "--model", "llama3-8b")
    assert code == 0 and doc["plan"]["tp"] == 2 and doc["job"]["kernels"] == "torchtitan"


def test_torchtitan_overrides_without_model_point_to_their_launch_script(autotune_proc, tmp_path: Path) -> None:
    overrides = _emitted(tmp_path, "even", "torchtitan") / "torchtitan_overrides.txt"
    proc = autotune_proc("check", str(overrides), "--gpu", "h100-sxm", "--gpus", "16")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "or check launch_torchtitan.sh beside it, which names it" in proc.stderr


# ------------------------------------------------------------------------------------------ exit 4 and 5
def test_gap_exits_4(cli, tmp_path: Path) -> None:
    """tp 8 x pp 1 on two nodes is predicted at least 30% slower than the best plan: --max-gap 10 fails."""
    path = _write(tmp_path, "slow.txt", ARGS.replace("PARALLEL", "--tensor-model-parallel-size 8"))
    doc, code = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "16", "--max-gap", "10")
    assert code == 4
    assert doc["check"]["gain_pct"] >= 30
    assert doc["check"]["best"]["step_time_s"] < doc["step_time_s"]
    doc, code = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "16", "--max-gap", "99")
    assert code == 0


def test_out_of_memory_exits_5_naming_stage_and_term(cli, tmp_path: Path) -> None:
    """tp 1 pp 1 without ZeRO: 16 bytes of weights and Adam state per parameter, 8B parameters, on 80 GB."""
    path = _write(tmp_path, "oom.txt", ARGS.replace("PARALLEL", "--tensor-model-parallel-size 1"))
    result = cli("check", str(path), "--gpu", "h100-sxm", "--gpus", "16")
    assert result.exit_code == 5
    # the verdict is a diagnostic: on stderr (CLI.md), the report on stdout
    assert "error: stage 0 is predicted out of memory" in result.stderr and "error:" not in result.stdout
    assert "binding term: optimizer states" in result.stderr
    assert "OUT OF MEMORY" in result.stdout
    github = cli("check", str(path), "--gpu", "h100-sxm", "--gpus", "16", "--format", "github")
    lines = github.stdout.splitlines()
    assert github.exit_code == 5
    assert all(line.startswith(("::notice ", "::warning ", "::error ")) for line in lines)
    assert sum(line.startswith("::error ") for line in lines) == 1
    assert "stage 0 is predicted out of memory" in github.stdout and "binding term: optimizer states" in github.stdout


def test_out_of_memory_config_is_not_compared_for_speed(cli, tmp_path: Path) -> None:
    """A config that does not fit has no step time to set against the best plan: the report says so instead of
    calling it faster or slower."""
    path = _write(tmp_path, "oom.txt", ARGS.replace("PARALLEL", "--tensor-model-parallel-size 1"))
    result = cli("check", str(path), "--gpu", "h100-sxm", "--gpus", "16")
    assert result.exit_code == 5
    assert "the config does not fit, so its step time is no comparison" in result.stdout
    doc, code = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "16")
    assert code == 5 and doc["check"]["gain_pct"] is None


def test_a_sequence_that_sequence_parallelism_cannot_split_is_refused(cli, tmp_path: Path) -> None:
    """8191 tokens over tp 2 with --sequence-parallel: Megatron's scatter along the sequence fails at start-up."""
    text = ARGS.replace("PARALLEL", "--tensor-model-parallel-size 2 --sequence-parallel").replace(
        "--seq-length 8192", "--seq-length 8191")
    from autotune.errors import SpecError

    with pytest.raises(SpecError, match="seq_len 8191: megatron needs it divisible by tp"):
        cli("check", str(_write(tmp_path, "seq.txt", text)), "--gpu", "h100-sxm", "--gpus", "16")


def test_emit_better_round_trips(cli, tmp_path: Path) -> None:
    """--emit-better writes the best plan for the same trainer; checking that config finds no gap."""
    path = _write(tmp_path, "slow.txt", ARGS.replace("PARALLEL", "--tensor-model-parallel-size 8"))
    out = tmp_path / "better"
    doc, _ = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "16", "--emit-better", str(out))
    assert sorted(p.name for p in out.iterdir()) == ["launch_megatron.sh", "sbatch_megatron.sh"]
    again, code = _check_json(cli, str(out / "launch_megatron.sh"), "--gpu", "h100-sxm", "--gpus", "16",
                              "--max-gap", "0.5")
    assert again["plan"] == doc["check"]["best"]["plan"]
    assert code == 0


def test_readme_example(cli) -> None:
    doc, code = _check_json(cli, str(EXAMPLE), "--gpu", "h100-sxm", "--gpus", "512")
    plan = doc["plan"]
    assert (plan["tp"], plan["pp"], plan["dp"], plan["vpp"], plan["recompute"]) == (8, 4, 16, 4, "selective")
    assert doc["model_spec"]["name"] == "llama3-70b" and code == 0


# ------------------------------------------------------------------------------------------ bad input
BAD = {
    "no-launch.sh": ("#!/bin/bash\necho training\npython train.py --lr 1\n", [], "no pretrain_gpt.py call"),
    "bad.toml": ('[parallelism]\ntensor_parallel_degree = "2"\n[model]\nflavor = "8B"\n', [],
                 "parallelism.tensor_parallel_degree must be an integer"),
    "ds_config.json": ('{"gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1}}',
                       ["--model", "llama3-8b", "--seq-len", "4096"],
                       "neither train_batch_size nor train_micro_batch_size_per_gpu"),
    "degrees.toml": ("[model]\nflavor = \"8B\"\n[parallelism]\ndata_parallel_shard_degree = 4\n"
                     "tensor_parallel_degree = 2\n", [], "but --gpus is 16"),
    "args.txt": (ARGS.replace("PARALLEL", "--tensor-model-parallel-size 3"), [], "does not divide --gpus 16"),
    "seq0.txt": (ARGS.replace("--seq-length 8192", "--seq-length 0").replace("PARALLEL", ""), [],
                 "--seq-length 0: Megatron needs at least 1"),
    "mbs0.json": ('{"train_batch_size": 256, "train_micro_batch_size_per_gpu": 0, "gradient_accumulation_steps": 4}',
                  ["--model", "llama3-8b", "--seq-len", "4096"], "train_micro_batch_size_per_gpu must be >= 1, got 0"),
    # a zero read as "not given" became tp 1 or mbs 1; a zero head count divided by zero (user-tester, 2026-11-25)
    "tp0.txt": (ARGS.replace("PARALLEL", "--tensor-model-parallel-size 0"), [],
                "--tensor-model-parallel-size 0: Megatron needs at least 1"),
    "heads0.txt": (ARGS.replace("--num-attention-heads 32", "--num-attention-heads 0").replace("PARALLEL", ""), [],
                   "--num-attention-heads 0: Megatron needs at least 1"),
    "topk.txt": (ARGS.replace("PARALLEL", "--num-experts 8 --moe-router-topk 9 --expert-model-parallel-size 2"), [],
                 "--moe-router-topk 9 exceeds --num-experts 8"),
    # torchtitan 0.2.x's launch: the settings live in the TOML, which a script check silently dropped
    "tt_run.sh": ('CONFIG_FILE=${CONFIG_FILE:-"./train_configs/llama3_70b.toml"}\ntorchrun --nproc_per_node=8 -m '
                  'torchtitan.train --job.config_file ${CONFIG_FILE} --training.steps 100\n', ["--model", "llama3-70b"],
                  "--job.config_file ./train_configs/llama3_70b.toml: the run takes its settings from that TOML"),
    "lbs0.toml": ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 0\nseq_len = 8192\n'
                  '[parallelism]\ndata_parallel_shard_degree = 16\n', [],
                  "the torchtitan config's micro-batch size is 0; fix it in the config (at least 1)"),
    "gbs0.toml": ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
                  'global_batch_size = 0\n[parallelism]\ndata_parallel_shard_degree = 16\n', [],
                  "the torchtitan config's global batch size is 0; fix it in the config (at least 1)"),
    "auto.json": ('{"train_batch_size": 256, "train_micro_batch_size_per_gpu": "auto", "zero_optimization": '
                  '{"stage": 3}}', ["--model", "llama3-8b", "--seq-len", "4096"],
                  "train_micro_batch_size_per_gpu 'auto' is filled in by the Hugging Face Trainer when it runs"),
    "broken.json": ('{"train_batch_size": "', ["--model", "llama3-8b", "--seq-len", "4096"],
                    "not valid JSON at line 1, column 22: Unterminated string starting at"),
    # a model the catalog lacks, whose --vocab-size Megatron ignores without the NullTokenizer
    "uncatalogued.txt": (ARGS.replace("--num-layers 32", "--num-layers 30").replace("NullTokenizer",
                                                                                    "HuggingFaceTokenizer")
                         .replace("PARALLEL", ""), [],
                         "--vocab-size counts only with --tokenizer-type NullTokenizer"),
    # autotune's own DeepSpeed and Colossal-AI scripts name the file check reads (they used to send the user from
    # launch to sbatch and back)
    "launch_deepspeed.sh": ("#!/usr/bin/env bash\n# generated by autotune 0.1.0 for deepspeed (DeepSpeed 0.19.8)\n"
                            "deepspeed train.py\n", [], "autotune's DeepSpeed launch script: check the ds_config.json"),
    "colossalai_config.py": ("# generated by autotune 0.1.0 for colossalai (legacy)\nparallel = dict()\n", [],
                             "not Colossal-AI configs"),
    # the search's limits, refused as plan refuses them (they used to read as "none fits", exit 0)
    "work0.sh": (ARGS, ["--work-limit", "0"], "--work-limit must be > 0, got 0"),
    "time-5.sh": (ARGS, ["--time-limit", "-5"], "--time-limit must be > 0 seconds, got -5"),
    "timenan.sh": (ARGS, ["--time-limit", "nan"], "--time-limit must be > 0 seconds, got nan"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(autotune_proc, tmp_path: Path, name: str) -> None:
    text, extra, message = BAD[name]
    path = _write(tmp_path, name, text)
    out = tmp_path / "better"
    proc = autotune_proc("check", str(path), "--gpu", "h100-sxm", "--gpus", "16", "--emit-better", str(out), *extra)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert proc.stdout == "" and not out.exists()


def test_help(cli) -> None:
    result = cli("check", "--help")
    assert result.exit_code == 0
    for option in ("--trainer", "--model", "--max-gap", "--format", "--emit-better", "--json", "--seq-len"):
        assert option in result.stdout


def test_recompute_modules_and_unknown_flags_are_notes(cli, tmp_path: Path) -> None:
    path = _write(tmp_path, "args.txt", ARGS.replace("PARALLEL", "--tensor-model-parallel-size 2 "
                                                     "--recompute-granularity selective --recompute-modules mlp "
                                                     "--brand-new-flag a b"))
    doc, code = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "16")
    assert doc["plan"]["recompute"] == "selective" and code in (0, 5)  # 5: no ZeRO, 8B on tp 2 may not fit
    assert any("--recompute-modules mlp" in n for n in doc["check"]["notes"])
    assert any("unknown flag --brand-new-flag" in n for n in doc["check"]["notes"])


def test_torchtitan_toml_variant(cli, tmp_path: Path) -> None:
    """A hand-written TOML of the same plan: other key order, comments, inline values, defaults left out."""
    emitted = _plan_of(cli, _emitted(tmp_path, "even", "torchtitan", "toml") / "torchtitan.toml")
    variant = _write(tmp_path, "mine.toml", """# our 8B job, two nodes
[activation_checkpoint]
mode = "selective"   # op-level SAC
[parallelism]
pipeline_parallel_degree = 2
tensor_parallel_degree = 2
data_parallel_shard_degree = 4
fsdp_reshard_after_forward = "never"
pipeline_parallel_layers_per_stage = 16
pipeline_parallel_first_stage_less_layers = 0
pipeline_parallel_last_stage_less_layers = 0
[training]
seq_len = 8192
global_batch_size = 64
local_batch_size = 16
[model]
flavor = "8B"
name = "llama3"
[compile]
enable = true
[metrics]
log_freq = 10
""")
    assert _plan_of(cli, variant) == emitted


#: torchtitan 0.2.x TOML of llama3-8b on 16 GPUs (tp 2, pp 2, dp 4, global batch 64); LBS is replaced per test
ACCUMULATING_TOML = """[parallelism]
pipeline_parallel_degree = 2
tensor_parallel_degree = 2
data_parallel_shard_degree = 4
pipeline_parallel_microbatch_size = 1
[training]
seq_len = 8192
global_batch_size = 64
local_batch_size = LBS
[model]
flavor = "8B"
name = "llama3"
"""


def test_torchtitan_accumulation_with_a_pipeline_runs_the_schedule_per_step(cli, tmp_path: Path) -> None:
    """torchtitan runs global / (local x dp) forward-backward calls a step, each the whole pipeline schedule over
    local / microbatch_size micro-batches (0.3.0 trainer.py): local 4 on dp 4 is 4 flushes of 4 micro-batches,
    costed as 4 flushes and one optimizer step (user-tester: it read as one schedule of 16), and a local batch
    whose product with dp does not divide the global one is refused as torchtitan refuses it."""
    from dataclasses import replace

    from autotune.catalog import load_hardware
    from autotune.check.understood import read_config, understand
    from autotune.costmodel.estimate import CostModel

    one = _write(tmp_path, "one.toml", ACCUMULATING_TOML.replace("LBS", "16"))
    four = _write(tmp_path, "four.toml", ACCUMULATING_TOML.replace("LBS", "4"))
    whole, code = _check_json(cli, str(one), "--gpu", "h100-sxm", "--gpus", "16")
    doc, code4 = _check_json(cli, str(four), "--gpu", "h100-sxm", "--gpus", "16")
    assert whole["plan"] == doc["plan"] and doc["plan"]["num_microbatches"] == 16
    assert (whole["check"]["pipeline_flushes"], doc["check"]["pipeline_flushes"]) == (1, 4)
    assert any("runs the 1f1b schedule 4 times a step" in n for n in doc["check"]["notes"])
    kind, reading, fmt = read_config(four, None, 16)
    u = understand(four, reading, trainer=kind, fmt=fmt, gpus=16, model_arg=None, seq_len_arg=None)
    assert (u.flushes, u.job.global_batch) == (4, 64)
    flush = CostModel(u.model, load_hardware("h100-sxm"), replace(u.job, global_batch=16)).estimate(
        replace(u.plan, num_microbatches=4))
    by_hand = 4 * flush.step_time_s - 3 * flush.breakdown.optimizer_s
    assert doc["step_time_s"] == pytest.approx(by_hand, rel=1e-5)
    assert doc["step_time_s"] > whole["step_time_s"] * 1.05  # three more warm-ups and cool-downs
    assert doc["tokens_per_s"] == pytest.approx(64 * 8192 / by_hand, rel=1e-5)
    bad = _write(tmp_path, "bad.toml", ACCUMULATING_TOML.replace("LBS", "12"))
    with pytest.raises(SpecError, match=r"training.global_batch_size 64 is not a multiple of training.local_batch_size "
                       r"12 x data-parallel degree 4 \(torchtitan asserts it at start-up\)"):
        cli("check", str(bad), "--gpu", "h100-sxm", "--gpus", "16")


def test_estimate_of_an_accumulating_check_document_costs_its_flushes(cli, tmp_path: Path) -> None:
    """`estimate --plan` of check's document re-costs the config as check did: 4 runs of the schedule a step
    (check.pipeline_flushes), the same step time to the bit, said on stderr; it costed one schedule of 16
    micro-batches before (user-tester). A document whose flushes do not divide the micro-batches is refused."""
    four = _write(tmp_path, "four.toml", ACCUMULATING_TOML.replace("LBS", "4"))
    doc, _ = _check_json(cli, str(four), "--gpu", "h100-sxm", "--gpus", "16")
    saved = _write(tmp_path, "check.json", json.dumps(doc))
    again = cli("estimate", "--plan", str(saved), "--json")
    assert json.loads(again.stdout)["step_time_s"] == doc["step_time_s"]
    assert "check.pipeline_flushes 4: the config runs the 1f1b schedule 4 times a step" in again.stderr
    plain = _write(tmp_path, "plain.json", json.dumps({k: v for k, v in doc.items() if k != "check"}))
    one = json.loads(cli("estimate", "--plan", str(plain), "--json").stdout)
    assert one["step_time_s"] < doc["step_time_s"]  # one schedule of 16: three warm-ups and cool-downs fewer
    # plan --compare costs it the same way, with the settings it ran with (no torch.compile: --unfused)
    compared = json.loads(cli("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch",
                              "64", "--seq-len", "8192", "--trainer", "torchtitan", "--unfused", "--top", "0",
                              "--compare", str(saved), "--json").stdout)
    assert compared["compare"]["step_time_s"] == doc["step_time_s"]
    doc["check"]["pipeline_flushes"] = 3
    with pytest.raises(SpecError, match=r"check.pipeline_flushes 3 must be a whole number >= 1 dividing the plan's 16 "
                                        r"micro-batches"):
        cli("estimate", "--plan", str(_write(tmp_path, "bad.json", json.dumps(doc))))


def test_deepspeed_without_pipeline_file(cli, tmp_path: Path) -> None:
    """ds_config.json alone: dp from the batch keys, the rest of --gpus is tensor parallelism (noted)."""
    path = _write(tmp_path, "ds_config.json", json.dumps({
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 40000000}, "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW"}}))
    doc, code = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "16", "--model", "llama3-8b",
                            "--seq-len", "4096")
    assert (doc["plan"]["dp"], doc["plan"]["tp"], doc["plan"]["zero"]) == (8, 2, 3)
    assert any("no ds_pipeline.json" in n for n in doc["check"]["notes"])


@pytest.mark.parametrize("trainer,config", [("megatron", "launch_megatron.sh"), ("torchtitan", "launch_torchtitan.sh"),
                                            ("deepspeed", "ds_config.json")])
def test_plan_out_then_check(cli, tmp_path: Path, trainer: str, config: str) -> None:
    """`plan --trainer T --out DIR` then `check DIR/<config>`: the plan and every estimate field of plan.json
    come back byte for byte (the planner searches only what T runs as planned, so nothing is approximated)."""
    out = tmp_path / "run"
    job = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "32", "--seq-len", "4096"]
    planned = cli("plan", *job, "--trainer", trainer, "--out", str(out), "--json", "--top", "0")
    assert planned.exit_code == 0, planned.stdout
    saved = json.loads((out / "plan.json").read_text())
    # DeepSpeed's model and sequence come from ds_pipeline.json's "model" block, as the others' from their flags
    doc, _ = _check_json(cli, str(out / config), "--gpu", "h100-sxm", "--gpus", "8")
    keys = [k for k in doc if k not in ("check", "op_costs")]
    if trainer == "torchtitan":  # torchtitan has no bucket setting; `plan` still picks one (see the report)
        saved["plan"]["bucket_size"] = doc["plan"]["bucket_size"]
    assert {k: doc[k] for k in keys} == {k: saved[k] for k in keys}
    assert doc["check"]["gain_pct"] is not None and abs(doc["check"]["gain_pct"]) < 0.05


@pytest.mark.parametrize(("trainer", "said"), [("megatron", "runs launch_megatron.sh: check that file"),
                                               ("torchtitan", "only runs launch_torchtitan.sh (a Slurm wrapper): "
                                                              "check that file")])
def test_slurm_script_points_to_launch_script(autotune_proc, tmp_path: Path, trainer: str, said: str) -> None:
    _emitted(tmp_path, "even", trainer)
    proc = autotune_proc("check", str(tmp_path / f"sbatch_{trainer}.sh"), "--gpu", "h100-sxm", "--gpus", "16")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and said in proc.stderr


@pytest.mark.parametrize(("target", "said"), [("dir", "a directory; give the launch config inside it"),
                                              ("/dev/null", "not a regular file"), ("missing", "no such config file")])
def test_a_path_that_is_no_config_file_says_what_it_is(autotune_proc, tmp_path: Path, target: str,
                                                        said: str) -> None:
    path = {"dir": str(tmp_path), "missing": str(tmp_path / "nope.sh")}.get(target, target)
    proc = autotune_proc("check", path, "--gpu", "h100-sxm", "--gpus", "16")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and said in proc.stderr


def test_a_best_plan_a_limit_cut_short_says_so_and_exits_3(cli) -> None:
    """The comparison search stopped by --time-limit is not proven: a warning and exit 3, as `plan` exits (the
    README's example fits, and --max-gap 99 keeps its gap a warning)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "llama3-70b-tp8-pp4.sh"
    result = cli("check", str(example), "--gpu", "h100-sxm", "--gpus", "512", "--time-limit", "0.001",
                 "--max-gap", "99", "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 3 and doc["check"]["exit_code"] == 3
    assert any(f["message"].startswith("the best plan is not proven the best") and f["exit_code"] == 3
               for f in doc["check"]["findings"])


def test_a_sequence_length_that_contradicts_the_config_is_an_error(cli) -> None:
    """--seq-len fills in what a config leaves out; one that differs from the config's own was dropped silently."""
    from autotune.errors import SpecError

    with pytest.raises(SpecError, match="--seq-len 4096: the megatron config trains 8192-token sequences"):
        cli("check", str(EXAMPLE), "--gpu", "h100-sxm", "--gpus", "512", "--seq-len", "4096")
    result = cli("check", str(EXAMPLE), "--gpu", "h100-sxm", "--gpus", "512", "--seq-len", "8192")
    assert result.exit_code in (0, 4)


def test_an_unknown_torchtitan_flavor_is_named_in_the_error(cli, tmp_path: Path) -> None:
    from autotune.errors import SpecError

    path = _write(tmp_path, "tt.toml", '[model]\nflavor = "8b"\n[parallelism]\ntensor_parallel_degree = 8\n'
                  '[training]\nlocal_batch_size = 8\nseq_len = 4096\n')
    with pytest.raises(SpecError, match="flavor '8b': not a torchtitan model autotune knows"):
        cli("check", str(path), "--gpu", "h100-sxm", "--gpus", "8")


def test_a_missing_global_batch_is_said_to_default(cli, tmp_path: Path) -> None:
    """Without --global-batch-size Megatron trains micro-batch x dp sequences, one micro-batch: the interleaved
    schedule's rule then fails, and the message says where the batch came from."""
    from autotune.errors import SpecError

    text = ARGS.replace("PARALLEL", "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 4"
                        ).replace("--global-batch-size 64 ", "")
    with pytest.raises(SpecError, match=r"no --global-batch-size: Megatron's default is --micro-batch-size x "
                                        r"data-parallel size = 8\)"):
        cli("check", str(_write(tmp_path, "nogbs.txt", text)), "--gpu", "h100-sxm", "--gpus", "16")


def test_a_deepspeed_config_of_a_model_outside_the_catalog_checks_as_planned(cli, tmp_path: Path) -> None:
    """ds_pipeline.json's model block gives the whole shape (a GELU variant of llama3-8b the catalog lacks), so
    `check` costs the model the config builds, named as its header names it, without --model."""
    spec = json.loads((REPO / "profiles" / "models" / "llama3-8b.json").read_text())
    spec.update(name="custom-gelu", activation="gelu", ffn_hidden_size=16384)
    model = _write(tmp_path, "custom.json", json.dumps(spec))
    out = tmp_path / "run"
    planned = cli("plan", "--model", str(model), "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64",
                  "--seq-len", "2048", "--trainer", "deepspeed", "--pp", "2", "--out", str(out), "--json", "--top", "0")
    assert planned.exit_code == 0, planned.output
    doc, _ = _check_json(cli, str(out / "ds_config.json"), "--gpu", "h100-sxm", "--gpus", "16")
    assert doc["model_spec"]["name"] == "custom-gelu" and doc["model_spec"]["activation"] == "gelu"
    assert doc["step_time_s"] == json.loads(planned.stdout)["step_time_s"]


@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_without_overlap_comm_waits_on_its_reduction(cli, tmp_path: Path, stage: int) -> None:
    """overlap_comm defaults to false below ZeRO-3 (deepspeed's overlap_comm_valid): ZeRO-1 then reduces after the
    backward and ZeRO-2 reduce-scatters each bucket on the compute stream, so the exposed data-parallel time is
    the larger, unoverlapped one; true overlaps it."""
    exposed = {}
    for overlap in (None, True):
        zero = {"stage": stage, **({} if overlap is None else {"overlap_comm": overlap})}
        path = _write(tmp_path, f"ds_config_{overlap}.json", json.dumps({
            "train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
            "zero_optimization": zero, "bf16": {"enabled": True}}))
        doc, _ = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "16", "--model", "llama3-8b",
                             "--seq-len", "4096")
        exposed[overlap] = doc["breakdown"]["dp_comm_exposed_s"]
    assert exposed[None] > exposed[True] > 0


def test_megatron_overlap_switches_are_read(cli, tmp_path: Path) -> None:
    """Megatron-LM's --overlap-grad-reduce and --overlap-param-gather are off by default (DDP then reduces in
    finish_grad_sync once the backward ends, and the distributed optimizer gathers in its step) and its
    interleaved schedule overlaps pipeline sends unless --no-overlap-p2p-communication: `check` costs each
    script as it runs."""
    base = INTERLEAVED_8B
    docs = {}
    for name, extra in (("plain", ""), ("overlap", "--overlap-grad-reduce"),
                        ("blocking", "--overlap-grad-reduce --no-overlap-p2p-communication"),
                        ("gathered", "--overlap-grad-reduce --overlap-param-gather")):
        path = _write(tmp_path, f"{name}.sh", base + extra + "\n")
        docs[name], code = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "32", "--model", "llama3-8b")
        assert code == 0, docs[name]
    terms = {k: d["breakdown"] for k, d in docs.items()}
    assert terms["plain"]["dp_comm_exposed_s"] > terms["overlap"]["dp_comm_exposed_s"]
    assert terms["blocking"]["pp_comm_s"] > terms["overlap"]["pp_comm_s"] > 0
    assert terms["plain"]["pp_comm_s"] == terms["overlap"]["pp_comm_s"]
    # the JSON says how much of it waits: pp 4, vpp 4, 16 micro-batches: rank 0 warms up 2*3 + 3*4 = 18 of 64
    assert docs["blocking"]["overlap"]["p2p_waited_share"] == 1.0
    assert docs["overlap"]["overlap"]["p2p_waited_share"] == pytest.approx(18 / 64, rel=1e-5)
    assert docs["plain"]["overlap"]["grads_after_backward"] and not docs["overlap"]["overlap"]["grads_after_backward"]
    # without --overlap-param-gather the distributed optimizer gathers the updated weights in its step
    assert terms["overlap"]["dp_comm_exposed_s"] > terms["gathered"]["dp_comm_exposed_s"]


def test_megatron_fsdp_overlaps_its_reduction_with_or_without_the_flag(cli, tmp_path: Path) -> None:
    """Found in review: Megatron-FSDP forces overlap_grad_reduce when it shards gradients (optim_grads,
    optim_grads_params), so a script without --overlap-grad-reduce runs, and is costed, as one with it."""
    base = ("#!/bin/bash\npython pretrain_gpt.py --bf16 --micro-batch-size 1 --global-batch-size 64 "
            "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --tensor-model-parallel-size 2 "
            "--sequence-parallel " + LLAMA_8B_SHAPE)
    steps = []
    for name, extra in (("plain", ""), ("flag", "--overlap-grad-reduce")):
        doc, code = _check_json(cli, str(_write(tmp_path, f"{name}.sh", base + extra + "\n")), "--gpu", "h100-sxm",
                                "--gpus", "32", "--model", "llama3-8b")
        assert code in (0, 4), doc
        steps.append(doc["step_time_s"])
    assert steps[0] == steps[1]


def test_megatron_overlap_flags_left_off_are_noted_and_bad_groups_refused(cli, tmp_path: Path) -> None:
    """Found in a user test: a script that leaves an overlap off says so (the best plan turns it on, which is the
    whole gap), a micro-batch group megatron-core rejects is refused, and so is warmup-flush without p2p overlap."""
    base = INTERLEAVED_8B
    args = ("--gpu", "h100-sxm", "--gpus", "32", "--model", "llama3-8b")
    doc, _ = _check_json(cli, str(_write(tmp_path, "off.sh", base + "--no-overlap-p2p-communication\n")), *args)
    notes = " ".join(doc["check"]["notes"])
    assert "no --overlap-grad-reduce" in notes and "no --overlap-param-gather" in notes
    assert "--no-overlap-p2p-communication: the interleaved schedule waits on every pipeline send" in notes
    doc, _ = _check_json(cli, str(_write(tmp_path, "group.sh", base + "--overlap-grad-reduce --overlap-param-gather "
                                         "--microbatch-group-size-per-virtual-pipeline-stage 8\n")), *args)
    assert any("costed as Megatron's default group of pp 4" in n for n in doc["check"]["notes"])
    for name, extra, message in (
            ("small.sh", "--microbatch-group-size-per-virtual-pipeline-stage 2", "at least pp (4)"),
            ("flush.sh", "--no-overlap-p2p-communication --overlap-p2p-communication-warmup-flush",
             "megatron-core refuses it")):
        with pytest.raises(SpecError, match=re.escape(message)):
            cli("check", str(_write(tmp_path, name, base + extra + "\n")), *args)


def test_check_json_of_a_config_with_an_overlap_off_re_estimates_as_it_runs(cli, tmp_path: Path) -> None:
    """Found in a user test: `check --json` records the overlaps a config leaves off in its job block, and
    `estimate --plan` of that document re-costs it as the config runs, to the byte."""
    script = _write(tmp_path, "off.sh", INTERLEAVED_8B + "--no-overlap-p2p-communication\n")
    checked = cli("check", str(script), "--gpu", "h100-sxm", "--gpus", "32", "--model", "llama3-8b", "--json")
    doc = json.loads(checked.stdout)
    assert {k: doc["job"][k] for k in ("overlap_grad_reduce", "overlap_param_gather", "overlap_p2p")} == dict.fromkeys(
        ("overlap_grad_reduce", "overlap_param_gather", "overlap_p2p"), False)
    saved = _write(tmp_path, "checked.json", checked.stdout)
    again = json.loads(cli("estimate", "--plan", str(saved), "--json").stdout)
    assert again["step_time_s"] == doc["step_time_s"] and again["breakdown"] == doc["breakdown"]
    # emit writes the config with every overlap on, says so, and states that estimate (not "edited since?")
    emitted = cli("emit", "--plan", str(saved), "--trainer", "megatron", "--out", str(tmp_path / "emitted"))
    assert "edited since" not in emitted.output
    assert ("the checked config left overlap_grad_reduce, overlap_param_gather, overlap_p2p, cross_entropy off"
            in emitted.output)
    header = (tmp_path / "emitted" / "launch_megatron.sh").read_text()
    assert f"{doc['step_time_s']:.3f} s" not in header


def test_overlap_notes_and_group_checks_follow_the_plan(cli, tmp_path: Path) -> None:
    """Found in review: a micro-batch group megatron-core refuses for the plan (more than its micro-batches, or a
    remainder short of pp) is refused, one it ignores (no interleaving) is not; warmup-flush without interleaving
    is refused; and without data parallelism no reduction or gather note is made or recorded."""
    layers = (LLAMA_8B_SHAPE + "--sequence-parallel --use-distributed-optimizer --tensor-model-parallel-size 2 "
              "--pipeline-model-parallel-size 4 ")
    args = ("--gpu", "h100-sxm", "--gpus", "32", "--model", "llama3-8b")
    interleaved = "--num-layers-per-virtual-pipeline-stage 2 --micro-batch-size 1 --global-batch-size 64 "
    for group, message in (("64", "at most the micro-batches (16)"), ("7", "no remainder")):
        path = _write(tmp_path, f"g{group}.sh", f"python pretrain_gpt.py --bf16 {layers}{interleaved}"
                      f"--microbatch-group-size-per-virtual-pipeline-stage {group}\n")
        with pytest.raises(SpecError, match=re.escape(message)):
            cli("check", str(path), *args)
    flat = f"python pretrain_gpt.py --bf16 {layers}--micro-batch-size 1 --global-batch-size 64 "
    doc, code = _check_json(cli, str(_write(tmp_path, "flat.sh", flat + "--overlap-grad-reduce --overlap-param-gather "
                                            "--microbatch-group-size-per-virtual-pipeline-stage 2\n")), *args)
    assert code in (0, 4) and not any("microbatch-group" in n for n in doc["check"]["notes"])
    with pytest.raises(SpecError, match="turns off without interleaving"):
        cli("check", str(_write(tmp_path, "flush.sh", flat + "--overlap-p2p-communication-warmup-flush\n")), *args)
    alone = ("--gpu", "h100-sxm", "--gpus", "8", "--model", "llama3-8b")  # tp 2 x pp 4: dp 1
    doc, _ = _check_json(cli, str(_write(tmp_path, "alone.sh", flat + "\n")), *alone)
    assert not any("overlap" in n for n in doc["check"]["notes"])
    assert not {"overlap_grad_reduce", "overlap_param_gather", "overlap_p2p"} & set(doc["job"])


def test_deepspeed_pipeline_without_overlap_comm_is_not_noted(cli, tmp_path: Path) -> None:
    """Found in review: with a pipeline DeepSpeed reduces after the backward whatever overlap_comm says, so a
    ZeRO-1 pipeline config without it is costed and said alike."""
    out = tmp_path / "run"
    planned = cli("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64",
                  "--seq-len", "2048", "--trainer", "deepspeed", "--pp", "2", "--zero", "1", "--out", str(out),
                  "--json", "--top", "0")
    assert planned.exit_code == 0, planned.output
    config = json.loads((out / "ds_config.json").read_text())
    del config["zero_optimization"]["overlap_comm"]
    (out / "ds_config.json").write_text(json.dumps(config))
    doc, _ = _check_json(cli, str(out / "ds_config.json"), "--gpu", "h100-sxm", "--gpus", "16")
    assert not any("overlap_comm" in n for n in doc["check"]["notes"])
    assert doc["step_time_s"] == json.loads(planned.stdout)["step_time_s"]


MIXTRAL_SCRIPT = """#!/bin/bash
torchrun --nproc-per-node 8 pretrain_gpt.py \\
  --num-layers 56 --hidden-size 6144 --ffn-hidden-size 16384 --num-attention-heads 48 \\
  --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 65536 \\
  --position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights \\
  --disable-bias-linear --tokenizer-type HuggingFaceTokenizer --tokenizer-model mistralai/Mixtral-8x22B-v0.1 \\
  --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --moe-token-dispatcher-type alltoall \\
  --expert-model-parallel-size 8 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 \\
  --sequence-parallel --micro-batch-size 1 --global-batch-size 1024 --bf16 --use-distributed-optimizer
"""


def test_the_expert_all_to_all_overlap_is_read_and_held_to_megatrons_rules(cli, autotune_proc, tmp_path: Path) -> None:
    """--overlap-moe-expert-parallel-comm is costed as the plan's ep_overlap (estimate agrees), and without a
    virtual pipeline beside pp 4 it is refused as megatron-core refuses it."""
    flag = " --overlap-moe-expert-parallel-comm"
    interleaved = MIXTRAL_SCRIPT.replace("--sequence-parallel", "--sequence-parallel "
                                         "--num-virtual-stages-per-pipeline-rank 2")
    on = _write(tmp_path, "on.sh", interleaved.replace(" --use-distributed-optimizer",
                                                       " --use-distributed-optimizer" + flag))
    off = _write(tmp_path, "off.sh", interleaved)
    doc_on, _ = _check_json(cli, str(on), "--gpu", "h100-sxm", "--gpus", "256")
    doc_off, _ = _check_json(cli, str(off), "--gpu", "h100-sxm", "--gpus", "256")
    assert doc_on["plan"]["ep_overlap"] is True and "ep_overlap" not in doc_off["plan"]
    assert doc_on["step_time_s"] < doc_off["step_time_s"]
    args = ("estimate", "--model", "mixtral-8x22b", "--gpu", "h100-sxm", "--gpus", "256", "--global-batch", "1024",
            "--seq-len", "4096", "--tp", "4", "--pp", "4", "--vpp", "2", "--ep", "8", "--etp", "4", "--zero", "1",
            "--json")
    plain, over = (json.loads(cli(*args, *flags).stdout) for flags in ((), ("--ep-overlap",)))
    assert over["plan"]["ep_overlap"] is True and over["step_time_s"] < plain["step_time_s"]
    bad = _write(tmp_path, "bad.sh", MIXTRAL_SCRIPT.replace(" --use-distributed-optimizer",
                                                            " --use-distributed-optimizer" + flag))
    result = autotune_proc("check", str(bad), "--gpu", "h100-sxm", "--gpus", "256")
    assert result.returncode == 1 and "ep_overlap with pp > 1 runs in Megatron's interleaved schedule" in \
        result.stderr and "ep_overlap is --overlap-moe-expert-parallel-comm" in result.stderr


def test_a_config_that_trains_in_fp32_is_refused_with_the_fix(autotune_proc, tmp_path: Path) -> None:
    """Without a 16-bit precision both trainers train in fp32, with twice the memory autotune would cost: refused,
    naming the flag or block to add (it was costed as bf16 and said to fit, user-tester)."""
    script = _write(tmp_path, "fp32.txt", ARGS.replace("PARALLEL", "").replace("--bf16", ""))
    proc = autotune_proc("check", str(script), "--gpu", "h100-sxm", "--gpus", "8")
    assert proc.returncode == 1 and proc.stderr.strip().endswith("add --bf16 to check that run"), proc.stderr
    config = _write(tmp_path, "ds_config.json", json.dumps({
        "train_batch_size": 256, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16,
        "zero_optimization": {"stage": 1}}))
    proc = autotune_proc("check", str(config), "--gpu", "h100-sxm", "--gpus", "16", "--model", "llama3-8b",
                         "--seq-len", "4096")
    assert proc.returncode == 1 and "trains in fp32 (no 16-bit precision set), which autotune does not cost" in \
        proc.stderr and proc.stderr.strip().endswith('add "bf16": {"enabled": true} to check that run')
    assert autotune_proc("check", str(_write(tmp_path, "bf16.txt", ARGS.replace("PARALLEL", ""))), "--gpu",
                         "h100-sxm", "--gpus", "8").returncode in (0, 4, 5)


def test_no_deepspeed_plan_is_proposed_for_a_mixture_of_experts(autotune_proc, tmp_path: Path) -> None:
    """`plan --trainer deepspeed` refuses an MoE model (no MoE config is written for DeepSpeed), so check proposes
    none either, says why, and --emit-better leaves the config's own verdict (out of memory, exit 5) standing; it
    proposed an ep 8 DeepSpeed plan, and --emit-better then failed with exit 1 (user-tester)."""
    config = _write(tmp_path, "ds_config.json", json.dumps({
        "train_batch_size": 256, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16,
        "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}))
    args = ("check", str(config), "--gpu", "h100-sxm", "--gpus", "16", "--model", "mixtral-8x7b", "--seq-len", "4096")
    proc = autotune_proc(*args)
    assert proc.returncode == 5 and "best plan for deepspeed: none (--trainer deepspeed: autotune writes no " \
        "expert-parallel (MoE) config" in proc.stdout
    proc = autotune_proc(*args, "--emit-better", str(tmp_path / "better"))
    assert proc.returncode == 5 and not (tmp_path / "better").exists(), proc.stderr


@pytest.mark.parametrize("model", [(), ("--model", "mixtral-8x22b")])
def test_dropout_left_at_megatrons_default_is_a_training_choice_not_a_shape(cli, tmp_path: Path, model) -> None:
    """A Mixtral script that leaves dropout at Megatron's 0.1 and takes its vocabulary from a Hugging Face
    tokenizer is the catalog's mixtral-8x22b (catalogued without dropout), with and without --model, costed with
    the dropout it runs; each error used to point at the other (user-tester, 2026-11-25)."""
    path = _write(tmp_path, "mixtral.sh", MIXTRAL_SCRIPT)
    doc, _ = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "256", *model)
    assert doc["model_spec"]["name"] == "mixtral-8x22b" and doc["model_spec"]["dropout"] is True
    assert any("dropout on as the config runs it" in n for n in doc["check"]["notes"])


def test_a_dense_script_never_matches_a_mixture_of_experts(cli, tmp_path: Path) -> None:
    """A Mistral-7B-shaped script without MoE flags has Mixtral-8x7B's attention and expert width: it is dense, not
    the MoE model (it read as mixtral-8x7b and out of memory, user-tester 2026-11-25)."""
    script = """torchrun --nproc_per_node 8 pretrain_gpt.py \\
  --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \\
  --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm \\
  --position-embedding-type rope --rotary-base 1000000 --untie-embeddings-and-output-weights \\
  --disable-bias-linear --attention-dropout 0.0 --hidden-dropout 0.0 --seq-length 4096 \\
  --max-position-embeddings 32768 --tokenizer-type HuggingFaceTokenizer --tokenizer-model mistralai/Mistral-7B-v0.3 \\
  --tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 1 --global-batch-size 64 --bf16
"""
    path = _write(tmp_path, "mistral.sh", script)
    doc, _ = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "8")
    assert doc["model_spec"]["num_experts"] in (0, 1) and "mixtral" not in doc["model_spec"]["name"]


def test_emit_of_a_checked_te_loss_config_writes_the_loss_its_header_predicts(cli, tmp_path: Path) -> None:
    """A config running Transformer Engine's loss, checked to JSON and emitted: the files keep that loss, so the
    header's prediction is of what they run (they wrote the native one under TE's figures, review 2026-11-25)."""
    script = _write(tmp_path, "te.sh", INTERLEAVED_8B + "--overlap-grad-reduce --overlap-param-gather "
                    "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te\n")
    checked = cli("check", str(script), "--gpu", "h100-sxm", "--gpus", "32", "--model", "llama3-8b", "--json")
    doc = json.loads(checked.stdout)
    assert doc["job"]["cross_entropy"] == "te"
    saved = _write(tmp_path, "checked.json", checked.stdout)
    emitted = cli("emit", "--plan", str(saved), "--trainer", "megatron", "--out", str(tmp_path / "emitted"))
    assert "edited since" not in emitted.output and "cross_entropy" not in emitted.output
    launch = (tmp_path / "emitted" / "launch_megatron.sh").read_text()
    assert "--cross-entropy-fusion-impl te" in launch and f"{doc['step_time_s']:.3f} s" in launch


def test_a_script_planned_from_a_config_json_names_the_file_to_pass(cli, tmp_path: Path) -> None:
    """A model outside the catalog: its Megatron script cannot give the vocabulary (the tokenizer does), so the
    error names the config.json autotune's header records (user-tester); with it, the script reads back."""
    config = tmp_path / "mine.json"
    config.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 20, "hidden_size": 3072,
                                  "num_attention_heads": 24, "num_key_value_heads": 8, "intermediate_size": 8192,
                                  "vocab_size": 50000}))
    out = tmp_path / "run"
    assert cli("plan", "--model", str(config), "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64",
               "--seq-len", "4096", "--trainer", "megatron", "--top", "0", "--out", str(out)).exit_code == 0
    script = str(out / "launch_megatron.sh")
    with pytest.raises(SpecError, match=f"or pass --model {re.escape(str(config))} \\(the model file"):
        cli("check", script, "--gpu", "h100-sxm", "--gpus", "8")
    assert cli("check", script, "--gpu", "h100-sxm", "--gpus", "8", "--model", str(config)).exit_code == 0


def test_a_script_checked_at_another_gpu_count_says_so(cli, tmp_path: Path) -> None:
    """Only dp differs from autotune's header: the note names the header's GPU count, not an edit (user-tester)."""
    out = tmp_path / "run"
    assert cli("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64",
               "--seq-len", "4096", "--trainer", "megatron", "--top", "0", "--out", str(out)).exit_code == 0
    text = cli("check", str(out / "launch_megatron.sh"), "--gpu", "h100-sxm", "--gpus", "32").output
    assert "autotune header plans dp" in text and "(16 GPUs), checked here at --gpus 32" in text
    assert "edited since" not in text


@pytest.mark.parametrize("flag", ["--attention-backend local", "--transformer-impl local"])
def test_megatron_local_attention_is_costed_unfused(cli, tmp_path: Path, flag: str) -> None:
    """megatron-core's own DotProductAttention (the local backend, and the local layer spec) keeps the s x s
    scores: costed as --attention-backend unfused, with a note (user-tester: read as fused, a config 95 GiB over an
    80 GB GPU passed as fitting)."""
    parallel = "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel"
    base = ARGS.replace("PARALLEL", f"{parallel} --use-distributed-optimizer")
    unfused, code_u = _check_json(cli, str(_write(tmp_path, "u.txt", base + "--attention-backend unfused\n")),
                                  "--gpu", "h100-sxm", "--gpus", "32")
    local, code_l = _check_json(cli, str(_write(tmp_path, "l.txt", base + flag + "\n")), "--gpu", "h100-sxm",
                                "--gpus", "32")
    assert local["step_time_s"] == unfused["step_time_s"] and local["peak_memory_gib"] == unfused["peak_memory_gib"]
    assert code_l == code_u and any(f"{flag}: megatron-core's own DotProductAttention" in n
                                    for n in local["check"]["notes"])


@pytest.mark.parametrize(("extra", "message"), [
    ("--model.converters float8", "--model.converters float8: torchtitan 0.3.x takes no model options on its command "
     "line (tyro refuses them: a config function builds the model); its Float8 linears come with a config function "
     "that converts them (llama3_405b's does), or check the 0.2.x TOML that sets [model]"),
    ("--model.flavor 70B", "--model.flavor 70B: torchtitan 0.3.x takes no model options on its command line (tyro "
     "refuses them: a config function builds the model); give --module llama3 --config llama3_70b, or check the "
     "0.2.x TOML that sets [model]"),
])
def test_torchtitan_command_line_model_options_are_refused(cli, tmp_path: Path, extra: str, message: str) -> None:
    """torchtitan 0.3.0's own parser (ConfigManager.parse_args) exits with "Unrecognized options: --model.converters"
    and "--model.flavor": Trainer.Config suppresses the model from tyro. check read the first as fp8 and left the
    second unread ("the config does not define the model"); both are refused, naming the fix. Float8 read from a
    config function that sets it stays fp8 (llama3_405b)."""
    launch = ("torchrun --nproc_per_node=8 -m torchtitan.train --module llama3 --config llama3_8b "
              "--training.local_batch_size 4 --training.global_batch_size 128 --training.seq_len 8192 "
              "--parallelism.data_parallel_shard_degree -1 --compile.enable ")
    with pytest.raises(SpecError) as err:
        cli("check", str(_write(tmp_path, "f.sh", launch + extra + "\n")), "--gpu", "h100-sxm", "--gpus", "32")
    assert str(err.value) == message
    fp8, _ = _check_json(cli, str(_write(tmp_path, "405.sh", launch.replace("llama3_8b", "llama3_405b") + "\n")),
                         "--gpu", "h100-sxm", "--gpus", "256")
    assert fp8["job"]["dtype"] == "fp8"


def test_deepspeed_zero_keys_autotune_does_not_read_are_named(cli, tmp_path: Path) -> None:
    """MiCS, hpZ and ZeRO++'s quantized collectives change memory or traffic: they were ignored without a word
    (user-tester); they are named in one note, and the keys autotune's own configs write are not."""
    config = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "contiguous_gradients": True,
                                                               "allgather_bucket_size": 40000000,
                                                               "mics_shard_size": 8, "zero_quantized_weights": True}}
    doc, _ = _check_json(cli, str(_write(tmp_path, "ds_config.json", json.dumps(config))), "--gpu", "h100-sxm",
                         "--gpus", "32", "--model", "llama3-8b", "--seq-len", "4096")
    named = [n for n in doc["check"]["notes"] if n.startswith("zero_optimization ")]
    assert named == ["zero_optimization mics_shard_size, zero_quantized_weights: not read by autotune; costed as "
                     "DeepSpeed runs without them"]


@pytest.mark.parametrize(("flags", "note"), [
    ("--num-distributed-optimizer-instances 2", "--num-distributed-optimizer-instances: each instance shards"),
    ("--context-parallel-size 2 --cp-comm-type a2a", "--cp-comm-type: costed as the p2p ring exchange"),
    ("--fp8-format e4m3 --fp8-recipe mxfp8", "--fp8-recipe: every FP8 recipe is costed as delayed"),
    ("--num-distributed-optimizer-instances 1 --context-parallel-size 2 --cp-comm-type p2p", None),
    ("--empty-unused-memory-level 1", None)])
def test_megatron_flags_costed_otherwise_are_named(cli, tmp_path: Path, flags: str, note: str | None) -> None:
    """Flags read as neutral without a word (user-tester): each now names how it is costed, unless its value is
    what the cost model prices; --empty-unused-memory-level takes a value (it was read as a switch)."""
    text = ARGS.replace("PARALLEL", f"--tensor-model-parallel-size 2 --sequence-parallel {flags}")
    doc, _ = _check_json(cli, str(_write(tmp_path, "a.txt", text)), "--gpu", "h100-sxm", "--gpus", "16")
    said = [n for n in doc["check"]["notes"] if n.startswith(("--num-distributed", "--cp-comm", "--fp8-recipe"))]
    assert said == ([] if note is None else [next(n for n in said if n.startswith(note))])
    assert not any("--empty-unused-memory-level" in n or "'1'" in n for n in doc["check"]["notes"])


def test_deepspeed_ulysses_without_an_mpu_is_read_as_context_parallelism(cli, tmp_path: Path) -> None:
    """ds_config.json's sequence_parallel_size (what autotune writes for a cp plan with tp 1) was 'ignored' and
    the run costed at cp 1 (user-tester): it is Ulysses of that degree, costed as context parallelism."""
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}, "sequence_parallel_size": 4}
    doc, _ = _check_json(cli, str(_write(tmp_path, "ds_config.json", json.dumps(config))), "--gpu", "h100-sxm",
                         "--gpus", "32", "--model", "llama3-8b", "--seq-len", "32768")
    assert (doc["plan"]["cp"], doc["plan"]["dp"], doc["plan"]["tp"]) == (4, 8, 1)
    assert "sequence_parallel_size 4: DeepSpeed-Ulysses, costed as context parallelism" in doc["check"]["notes"]


@pytest.mark.parametrize(("compile_section", "words"), [
    ("", "torchtitan kernels, the model eager (no torch.compile: costed unfused)"),
    ('[compile]\nenable = true\n', "torchtitan kernels, the model under torch.compile"),
    ('[compile]\nenable = true\ncomponents = ["loss"]\n',
     "torchtitan kernels, the model eager (no torch.compile: costed unfused)"),
])
def test_understood_line_says_whether_torchtitan_compiles(cli, tmp_path: Path, compile_section: str,
                                                          words: str) -> None:
    """torchtitan leaves torch.compile off unless the TOML turns it on for the model, and the step is costed with
    eager kernels then: the summary says which (a user-tester read 'torchtitan kernels' as the fused ones)."""
    config = _write(tmp_path, "tt.toml", '[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\n'
                    "tensor_parallel_degree = 2\ndata_parallel_shard_degree = 4\n[training]\nseq_len = 8192\n"
                    "global_batch_size = 64\nlocal_batch_size = 16\n" + compile_section)
    result = cli("check", str(config), "--gpu", "h100-sxm", "--gpus", "8")
    understood = next(line for line in result.stdout.splitlines() if line.startswith("understood: "))
    assert understood.endswith(", bf16, " + words), understood


def test_the_launchers_node_size_and_world_are_read(cli, tmp_path: Path) -> None:
    """torchrun's --nproc_per_node sizes a node (a plan for 4-GPU nodes was checked on 8, 14.187 s read as 13.931:
    user-tester), and --nnodes x --nproc_per_node against --gpus is said; --gpus-per-node given wins, noted."""
    from autotune.check.script import launcher_world

    assert launcher_world(["torchrun", "--nproc_per_node", "4", "--nnodes=16"]) == (4, 16)
    assert launcher_world(["torchrun", "--nproc-per-node=gpu", "--nnodes", "2:4"]) == (None, None)
    assert launcher_world(["deepspeed", "--num_gpus", "8", "--num_nodes", "2"]) == (8, 2)
    # an unquoted unset $NNODES expands to nothing: the next flag is not its value (reviewer)
    assert launcher_world(["torchrun", "--nnodes", "--nproc_per_node", "4"]) == (4, None)
    script = ("#!/bin/bash\nGPUS_PER_NODE=4\ntorchrun --nproc_per_node $GPUS_PER_NODE --nnodes 4 pretrain_gpt.py "
              "--bf16 --micro-batch-size 1 --global-batch-size 64 --use-distributed-optimizer "
              "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 " + LLAMA_8B_SHAPE + "\n")
    path = _write(tmp_path, "run.sh", script)
    doc, _ = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "16")
    assert doc["job"]["gpus_per_node"] == 4 and not any("launcher" in n for n in doc["check"]["notes"])
    doc, _ = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "32")
    assert ("the launcher starts 4 x 4 = 16 GPUs (--nnodes x --nproc_per_node); checked here at --gpus 32"
            in doc["check"]["notes"])
    doc, _ = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "16", "--gpus-per-node", "8")
    assert doc["job"]["gpus_per_node"] == 8
    notes = doc["check"]["notes"]
    assert "the launcher starts 4 GPUs a node (--nproc_per_node); checked with --gpus-per-node 8" in notes


def test_routing_imbalance_roundtrips_through_the_header_and_the_flag(cli, tmp_path: Path) -> None:
    """A plan's routing imbalance is a property of the run, not a config flag: autotune's header states it and
    check reads it back (a plan of 1.0 read at the default 1.25 predicted 1.425 s for 1.270: user-tester);
    --moe-imbalance checks another, refused past E/k as plan refuses it."""
    out = tmp_path / "run"
    done = cli("plan", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "256",
               "--seq-len", "4096", "--ep", "8", "--moe-imbalance", "1.0", "--trainer", "megatron", "--top", "0",
               "--out", str(out), "--json", "--no-timings")
    planned = json.loads(done.stdout)
    script = out / "launch_megatron.sh"
    assert "# routing: the busiest expert's tokens 1.0 x the mean (autotune's --moe-imbalance)" in script.read_text()
    doc, _ = _check_json(cli, str(script), "--gpu", "h100-sxm", "--gpus", "64")
    assert doc["step_time_s"] == planned["step_time_s"] and doc["job"]["moe_imbalance"] == 1.0
    assert any(n.startswith("routing imbalance 1.0 from autotune's header") for n in doc["check"]["notes"])
    other, _ = _check_json(cli, str(script), "--gpu", "h100-sxm", "--gpus", "64", "--moe-imbalance", "2")
    assert other["job"]["moe_imbalance"] == 2.0 and other["step_time_s"] > doc["step_time_s"]
    assert not any(n.startswith("routing imbalance") for n in other["check"]["notes"])
    with pytest.raises(SpecError, match="--moe-imbalance 200: "):
        cli("check", str(script), "--gpu", "h100-sxm", "--gpus", "64", "--moe-imbalance", "200")


def test_partly_sharded_state_is_costed_for_memory_over_its_shard_group(cli, tmp_path: Path) -> None:
    """torchtitan's HSDP (replicate 8 x shard 8) shards the state over 8 ranks, not 64, and Megatron's
    --num-distributed-optimizer-instances 8 over dp 8 leaves each instance one rank: their memory is the same
    plan's on the shard group (the Adam state of 70.6B parameters over 8 GPUs alone is 98.6 GiB), where it was
    noted as under-predicted and judged to fit, exit 0 (user-tester). The step time is the plan's own."""
    toml = ('[model]\nname = "llama3"\nflavor = "70B"\n[parallelism]\ndata_parallel_replicate_degree = 8\n'
            "data_parallel_shard_degree = 8\ntensor_parallel_degree = 1\n[training]\nseq_len = 8192\n"
            'global_batch_size = 64\nlocal_batch_size = 1\n[activation_checkpoint]\nmode = "full"\n')
    hsdp, code = _check_json(cli, str(_write(tmp_path, "hsdp.toml", toml)), "--gpu", "h100-sxm", "--gpus", "64")
    fsdp, code64 = _check_json(cli, str(_write(tmp_path, "fsdp.toml", toml.replace(
        "replicate_degree = 8", "replicate_degree = 1").replace("shard_degree = 8", "shard_degree = 64"))),
        "--gpu", "h100-sxm", "--gpus", "64")
    assert (code, code64) == (5, 0) and hsdp["step_time_s"] == fsdp["step_time_s"]
    assert hsdp["stages"][0]["memory_gib"]["optimizer"] == pytest.approx(8 * fsdp["stages"][0]["memory_gib"]
                                                                          ["optimizer"], rel=1e-6)
    script = INTERLEAVED_8B.replace("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                                    "--num-layers-per-virtual-pipeline-stage 2 --sequence-parallel",
                                    "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1")
    one, _ = _check_json(cli, str(_write(tmp_path, "one.sh", script)), "--gpu", "h100-sxm", "--gpus", "8")
    eight, _ = _check_json(cli, str(_write(tmp_path, "eight.sh", script + " --num-distributed-optimizer-instances 8")),
                           "--gpu", "h100-sxm", "--gpus", "8")
    assert eight["stages"][0]["memory_gib"]["optimizer"] == pytest.approx(8 * one["stages"][0]["memory_gib"]
                                                                          ["optimizer"], rel=1e-6)
    assert eight["step_time_s"] == one["step_time_s"]


def test_deepspeed_autotp_size_is_the_tensor_parallel_degree(cli, tmp_path: Path) -> None:
    """DeepSpeed's AutoTP training reads tensor_parallel.autotp_size (TPTrainingConfig): it was "ignored" and the
    config checked at tp 1, out of memory (user-tester). With dp 8 from the batch keys and 32 GPUs it is tp 4;
    a degree that does not make --gpus is refused."""
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}, "tensor_parallel": {"autotp_size": 4}}
    path = _write(tmp_path, "ds_config.json", json.dumps(config))
    doc, _ = _check_json(cli, str(path), "--gpu", "h100-sxm", "--gpus", "32", "--model", "llama3-8b", "--seq-len",
                         "4096")
    assert (doc["plan"]["tp"], doc["plan"]["dp"]) == (4, 8)
    assert not any("tensor_parallel" in n for n in doc["check"]["notes"])
    with pytest.raises(SpecError, match="tensor_parallel.autotp_size 4 x data-parallel 8 x sequence-parallel 1 = 32 "
                                        "GPUs, but --gpus is 64"):
        cli("check", str(path), "--gpu", "h100-sxm", "--gpus", "64", "--model", "llama3-8b", "--seq-len", "4096")


def test_github_format_annotates_a_config_it_cannot_read(autotune_proc, tmp_path: Path) -> None:
    """In a workflow a bad config showed no annotation, only a plain stderr line (user-tester): with --format
    github the error is also the file's ::error line on stdout; exit 1 and the stderr line stay."""
    path = _write(tmp_path, "bad.sh", "torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 32\n")
    proc = autotune_proc("check", str(path), "--gpu", "h100-sxm", "--gpus", "8", "--format", "github")
    assert proc.returncode == 1
    assert proc.stdout == (f"::error file={str(path).replace(':', '%3A').replace(',', '%2C')},title=autotune check::"
                           "the megatron config does not give the sequence length; pass --seq-len N\n")
    assert proc.stderr == "error: the megatron config does not give the sequence length; pass --seq-len N\n"


def test_torchtitan_without_compile_says_what_compiling_would_give(cli, tmp_path: Path) -> None:
    """A torchtitan config without torch.compile is costed with eager kernels (the best plan too, like for like)
    and the note gives the step the compiled model predicts; an earlier torchtitan's [training] compile is read
    as [compile] enable (it was ignored: user-tester)."""
    toml = ('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ntensor_parallel_degree = 2\n'
            "data_parallel_shard_degree = 4\n[training]\nseq_len = 8192\nglobal_batch_size = 64\n"
            "local_batch_size = 16\n")
    eager, _ = _check_json(cli, str(_write(tmp_path, "eager.toml", toml)), "--gpu", "h100-sxm", "--gpus", "8")
    old, _ = _check_json(cli, str(_write(tmp_path, "old.toml", toml + "compile = true\n")), "--gpu", "h100-sxm",
                         "--gpus", "8")
    assert old["job"]["fused_kernels"] is True and eager["job"]["fused_kernels"] is False
    assert "[training] compile: an earlier torchtitan's key, read as [compile] enable" in old["check"]["notes"]
    note = next(n for n in eager["check"]["notes"] if n.startswith("no torch.compile of the model"))
    assert f"predicts {old['step_time_s']:.3f} s a step" in note and old["step_time_s"] < eager["step_time_s"]


@pytest.mark.parametrize(("name", "text", "forced", "seen"), [
    ("run.toml", '[model]\nname = "llama3"\nflavor = "8B"\n', "megatron", "torchtitan"),
    ("run.sh", "torchrun pretrain_gpt.py --num-layers 32\n", "torchtitan", "megatron"),
    ("ds_config.json", '{"train_batch_size": 64}', "megatron", "deepspeed"),
])
def test_a_forced_trainer_that_is_not_the_configs_is_refused(cli, tmp_path: Path, name: str, text: str,
                                                             forced: str, seen: str) -> None:
    """--trainer naming another trainer than the file's gave unrelated errors ("no pretrain_gpt.py call found",
    "the torchtitan config does not define the model": user-tester): the message says whose config it is."""
    with pytest.raises(SpecError, match=f"^--trainer {forced}: {name} is a {seen} config"):
        cli("check", str(_write(tmp_path, name, text)), "--gpu", "h100-sxm", "--gpus", "8", "--trainer", forced)


def test_launches_and_variables_in_blocks_not_followed_are_said(cli, tmp_path: Path) -> None:
    """A launch inside a shell function gave "no pretrain_gpt.py call found" (there is one), and a degree set in a
    `case` block "has no value" without saying why (user-tester): both messages name what is not followed."""
    func = _write(tmp_path, "fn.sh", 'launch() { torchrun --nproc_per_node 8 pretrain_gpt.py "$@"; }\n'
                                     "launch --tensor-model-parallel-size 4\n")
    with pytest.raises(SpecError, match="the script launches pretrain_gpt.py only inside a shell function, loop, "
                                        "`case` or untaken branch, which autotune does not follow"):
        cli("check", str(func), "--gpu", "h100-sxm", "--gpus", "8")
    case = _write(tmp_path, "case.sh", 'case "${SIZE:-small}" in\n  small) TP=1;;\n  big) TP=8;;\nesac\n'
                                       "torchrun pretrain_gpt.py --tensor-model-parallel-size $TP --num-layers 32\n")
    with pytest.raises(SpecError, match="--tensor-model-parallel-size has no value; .* and does not follow the "
                                        "script's `case` block$"):
        cli("check", str(case), "--gpu", "h100-sxm", "--gpus", "8")


def test_distributed_optimizer_instances_follow_megatrons_rules(cli, tmp_path: Path) -> None:
    """megatron-core parallel_state asserts (dp x cp) % instances == 0 and expert dp % instances == 0: tp 4, cp 2,
    dp 1 with 2 instances runs (each instance one rank: the optimizer state twice as large), where check refused
    it for dp 1; instances that do not divide are refused naming both sizes (reviewer)."""
    base = INTERLEAVED_8B.replace("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                                  "--num-layers-per-virtual-pipeline-stage 2 --sequence-parallel",
                                  "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 1 "
                                  "--context-parallel-size 2 --sequence-parallel").replace(
        "--global-batch-size 64", "--global-batch-size 8")
    one, _ = _check_json(cli, str(_write(tmp_path, "one.sh", base)), "--gpu", "h100-sxm", "--gpus", "8")
    two, _ = _check_json(cli, str(_write(tmp_path, "two.sh", base + " --num-distributed-optimizer-instances 2")),
                         "--gpu", "h100-sxm", "--gpus", "8")
    assert one["plan"]["dp"] == 1 and one["plan"]["cp"] == 2
    assert two["stages"][0]["memory_gib"]["optimizer"] == pytest.approx(2 * one["stages"][0]["memory_gib"]
                                                                        ["optimizer"], rel=1e-6)
    path = _write(tmp_path, "three.sh", base + " --num-distributed-optimizer-instances 4")
    with pytest.raises(SpecError, match="4 distributed-optimizer instances .* must divide the data x context-parallel "
                                        "size 2"):
        cli("check", str(path), "--gpu", "h100-sxm", "--gpus", "8")


def test_megatron_vocabulary_padding_is_said_exactly(cli, tmp_path: Path) -> None:
    """Megatron-LM pads the vocabulary to a multiple of --make-vocab-size-divisible-by (default 128) x tp
    (_vocab_size_with_padding): GPT-2's 50257 at tp 8 becomes 51200, not '50264 or more' (user-tester); with a
    divisor of 1 it pads to the next multiple of tp alone."""
    gpt2 = ARGS.replace("--vocab-size 128255", "--vocab-size 50256").replace("PARALLEL",
                                                                            "--tensor-model-parallel-size 8")
    doc, _ = _check_json(cli, str(_write(tmp_path, "args.txt", gpt2)), "--gpu", "h100-sxm", "--gpus", "16")
    assert any("vocab 50257: Megatron pads it to 51200, a multiple of --make-vocab-size-divisible-by 128 x tp 8; "
               "costed unpadded (the LM head and embedding 1.9% larger in the run)" in n for n in doc["check"]["notes"])
    exact = gpt2.replace("--vocab-size 50256", "--vocab-size 50256 --make-vocab-size-divisible-by 1")
    doc, _ = _check_json(cli, str(_write(tmp_path, "exact.txt", exact)), "--gpu", "h100-sxm", "--gpus", "16")
    assert any("pads it to 50264" in n for n in doc["check"]["notes"])  # 50257 -> a multiple of 1 x 8


def test_a_megatron_window_is_costed_as_the_script_sets_it(cli, tmp_path: Path) -> None:
    """--window-size with --window-attn-skip-freq 2 windows every other layer of the 32 (megatron-core builds the
    window from TransformerConfig.window_size), so the check costs them windowed and faster than full attention;
    without the flags, full attention everywhere."""
    base = ARGS.replace("PARALLEL", "--tensor-model-parallel-size 2")
    full, _ = _check_json(cli, str(_write(tmp_path, "full.txt", base)), "--gpu", "h100-sxm", "--gpus", "16")
    windowed = base.replace("--swiglu", "--swiglu --window-size 128,0 --window-attn-skip-freq 2")
    doc, _ = _check_json(cli, str(_write(tmp_path, "win.txt", windowed)), "--gpu", "h100-sxm", "--gpus", "16")
    spec = doc["model_spec"]
    assert (spec["sliding_window"], spec["sliding_window_layers"]) == (128, 16)
    assert full["model_spec"]["sliding_window"] == 0 and doc["step_time_s"] < full["step_time_s"]
    assert not any("sets no attention window" in n or "unknown flag" in n for n in doc["check"]["notes"])


def test_an_alibi_models_megatron_script_reads_back_as_that_model(cli, tmp_path: Path) -> None:
    """The Megatron script of an ALiBi model (BLOOM) says --position-embedding-type none; it read back as RoPE, so
    `check --model` the header names refused it as another model (reviewer). It reads as position-free, costed as
    ALiBi is."""
    config = _write(tmp_path, "config.json", json.dumps({"model_type": "bloom", "n_layer": 4, "hidden_size": 256,
                                                         "n_head": 4, "vocab_size": 1024}))
    planned = cli("plan", "--model", str(config), "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "16",
                  "--seq-len", "1024", "--trainer", "megatron", "--out", str(tmp_path / "run"))
    assert planned.exit_code == 0, planned.output
    doc, code = _check_json(cli, str(tmp_path / "run" / "launch_megatron.sh"), "--gpu", "h100-sxm", "--gpus", "8",
                            "--model", str(config))
    assert code == 0 and doc["model_spec"]["position_embedding"] == "alibi"


def test_torchtitans_short_interleaved_pipeline_says_what_runs_and_what_is_costed(cli, tmp_path: Path) -> None:
    """deepseek_v3_671b's 4 micro-batches over pp 8: torch's ScheduleInterleaved1F1B runs fewer micro-batches than
    stages (user-tester: refused as if the trainer did), but autotune's interleaved order is Megatron's, so the
    refusal says so and what would be costed."""
    script = _write(tmp_path, "run.sh", "torchrun --nproc_per_node=8 -m torchtitan.train --module deepseek_v3 "
                    "--config deepseek_v3_671b --parallelism.pipeline_parallel_degree 8 "
                    "--parallelism.expert_parallel_degree 8 --parallelism.data_parallel_shard_degree 8\n")
    with pytest.raises(InvalidPlanError, match="torch's ScheduleInterleaved1F1B runs it.*not costed here"):
        cli("check", str(script), "--gpu", "h100-sxm", "--gpus", "64")
