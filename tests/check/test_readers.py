"""The readers against independent sources: bash itself for the script expander, megatron-core's layout parser,
torchtitan's own stage split, and hand-computed DeepSpeed batches."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from autotune.check.deepspeed_json import read_deepspeed
from autotune.check.megatron_args import parse_layout, read_megatron
from autotune.check.script import launch_words
from autotune.check.torchtitan_toml import read_toml, torchtitan_split
from autotune.errors import SpecError

SCRIPTS = {
    "defaults": 'A="${A:-x y}"\nB=${B:-7}\nC=${C-}\npython pretrain_gpt.py --a "$A" --b $B $C "${C}" end\n',
    "arrays": 'X=(--one 1 "--two words" \'--three $NOT\')\nX+=(--four)\nY=()\n'
              'python pretrain_gpt.py "${X[@]}" "${Y[@]}" ${X[0]} "${#X[@]}"\n',
    "continuations": "python \\\n  pretrain_gpt.py \\\n  --a 1 \\\n  --b 2 # comment\n",
    "if-else": 'V="${V:-1}"\nF=()\nif [[ "$V" != 0 ]]; then\n  F+=(--on)\nelif [ -n "$V" ]; then\n  F+=(--mid)\n'
               'else\n  F+=(--off)\nfi\nif (( 2 * 8 != 16 )); then\n  exit 1\nfi\npython pretrain_gpt.py "${F[@]}"\n',
    "arith-and-assign": 'N=${N:=3}\nM=$((N * 4))\nexport P=$N Q="q r"\npython pretrain_gpt.py --m $M --n "$N" $Q\n',
    "bash-c": 'TP=${TP:-4}\nexport ARGS="--lr 1"\nsrun --nodes 2 bash -c "python pretrain_gpt.py --tp $TP \\$ARGS"\n',
    "nested-default": 'python pretrain_gpt.py --x "${X:-${Y:-deep}}" --y "a${Z:-b}c" ${E:+set}\n',
    # quotes inside the default are removed (torchtitan's run_train.sh: TRAIN_FILE=${TRAIN_FILE:-"torchtitan.train"})
    "quoted-default": 'TP=${TP:-"4"}\nF=${F:-"a b"}\nS=${S:-\'$lit\'}\nQ=${Q-x"y z"w}\n'
                      'Y="a  b"\nX=$Y\nA=(p q)\nJ=${A[@]}\n'
                      'python pretrain_gpt.py --tp $TP "$F" $F "$S" "$Q" ${U:+"set"} "${V:-"in dq"}" "$X" "$J" '
                      '${A:-${B:-"x"}} "${A:-${B:-"x y"}}"\n',
}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_expander_matches_bash(tmp_path: Path, name: str) -> None:
    """The words our reader finds are the words bash passes (a fake `python` records them)."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/bash\nshift\nprintf "%s\\0" "$@"\n')
    fake.chmod(0o755)
    srun = tmp_path / "srun"  # runs its command after its options, as Slurm would on each node
    srun.write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift 2; done\nexec "$@"\n')
    srun.chmod(0o755)
    script = tmp_path / "run.sh"
    script.write_text("set -euo pipefail\n" + SCRIPTS[name])
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, check=True).stdout
    expected = out.decode().split("\0")[:-1]
    words, _ = launch_words(script.read_text(), lambda w: os.path.basename(w) == "pretrain_gpt.py", "pretrain_gpt.py")
    assert words == expected


@pytest.mark.parametrize("layout,pp", [("Ettt|(tttt|)*6tttL", 4), ("E|t*3|tt|tL", 2), ("Et*12|t*20L", 2),
                                       ("E(t|)*3tL", 2)])
def test_layout_matches_megatron_core(layout: str, pp: int) -> None:
    """Transformer layers per virtual stage, as megatron-core 0.16's own parser counts them."""
    core = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    stages = core.PipelineParallelLayerLayout.parse_str_to_list(layout)
    assert parse_layout(layout) == [sum(1 for layer in s if str(layer).endswith("decoder")) for s in stages]


@pytest.mark.parametrize("layers,pp,per_stage,first,last,per_rank", [
    (32, 4, 0, 1, 1, 1), (32, 4, 0, 1, 1, 2), (32, 2, 9, 1, 1, 2), (80, 8, 0, 0, 0, 2), (30, 4, 4, 1, 1, 2)])
def test_torchtitan_split_matches_torchtitan(layers, pp, per_stage, first, last, per_rank) -> None:
    """Layers per virtual stage as torchtitan 0.3.0's _generate_llm_fqn_per_model_part assigns them."""
    tt = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    counts, vpp = torchtitan_split(layers, pp, per_stage, first, last, per_rank)
    stages = -(-(layers + first + last) // per_stage) if per_stage else pp * per_rank
    parts = tt._generate_llm_fqn_per_model_part(stages, layers, first, last)
    assert list(counts) == [sum(1 for m in part if m.startswith("layers.")) for part in parts]
    assert vpp == stages // pp


def test_megatron_defaults_hand_computed() -> None:
    """Megatron's defaults where flags are absent: SwiGLU FFN int(4h*2/3/64)*64, dropout 0.1, learned positions,
    LayerNorm, biases, tied embeddings; dp comes later from --gpus."""
    r = read_megatron("--num-layers 4 --hidden-size 1000 --num-attention-heads 10 --swiglu --seq-length 128 "
                      "--max-position-embeddings 256\n")
    m = r.model_fields
    assert m is not None
    assert m["ffn_hidden_size"] == 2624  # int(4000 * 2 / 3 / 64) * 64 = int(41.67) * 64
    assert (m["dropout"], m["position_embedding"], m["max_position_embeddings"], m["norm"], m["bias"],
            m["tied_embeddings"]) == (True, "learned", 256, "layernorm", "all", True)
    assert (r.tp, r.pp, r.mbs, r.global_batch, r.zero, r.recompute) == (1, 1, 1, None, 0, "none")


def test_deepspeed_batch_keys_that_disagree_with_the_gpus_name_the_keys() -> None:
    """256 = 1 x 8 x dp needs dp 32, but 16 GPUs over tp 1 x pp 1 give 16: DeepSpeed's own assertion, said in its
    keys (it read as 'the config's degrees ... = 32 GPUs, but --gpus is 16', which suggests changing the job)."""
    pipeline = {"num_stages": 1, "mpu": {"tensor_model_parallel_size": 1}}
    with pytest.raises(SpecError, match=r"ds.json: train_batch_size 256 != train_micro_batch_size_per_gpu 1 x "
                       r"gradient_accumulation_steps 8 x data-parallel size 16 \(--gpus 16 / tp 1 x pp 1 x cp 1\), "
                       r"which DeepSpeed asserts; fix the batch keys, or check on 32 GPUs"):
        read_deepspeed({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                        "bf16": {"enabled": True}}, pipeline, 16, "ds.json")


def test_deepspeed_batch_keys_wanting_more_gpus_name_the_keys_without_a_pipeline_file() -> None:
    """Without ds_pipeline.json the data-parallel size is the batch keys' quotient: 256 / (2 x 2) = 64 on 32 GPUs
    read as 'the config's degrees ... dp 64 = 64 GPUs' (user-tester), which does not say where dp 64 comes from."""
    with pytest.raises(SpecError, match=r"z2.json: train_batch_size 256 / \(train_micro_batch_size_per_gpu 2 x "
                       r"gradient_accumulation_steps 2\) = data-parallel size 64, which does not divide --gpus 32"):
        read_deepspeed({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                        "bf16": {"enabled": True}}, None, 32, "z2.json")


def test_deepspeed_keys_the_pipeline_file_also_sets_must_agree() -> None:
    """A Ulysses degree or a partition method the JSON and ds_pipeline.json set apart were dropped without a word,
    the pipeline file winning (user-tester): refused, naming both; the checkpoint interval as DeepSpeed takes it."""
    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
              "bf16": {"enabled": True}}
    pipeline = {"num_stages": 2, "mpu": {"tensor_model_parallel_size": 1}, "activation_checkpoint_interval": 0}
    with pytest.raises(SpecError, match="ds.json: sequence_parallel_size 2 but ds_pipeline.json's "
                       "mpu.sequence_parallel_world_size 1; make them agree"):
        read_deepspeed({**config, "sequence_parallel_size": 2}, pipeline, 16, "ds.json")
    # the checkpoint interval is DeepSpeed's to resolve: the JSON's, where above 0, replaces the module's
    # (runtime/pipe/engine.py), noted; a JSON 0 leaves the module's
    r = read_deepspeed({**config, "pipeline": {"activation_checkpoint_interval": 1}}, pipeline, 16, "ds.json")
    assert r.recompute == "full" and any("replaces ds_pipeline.json's 0" in n for n in r.notes)
    r = read_deepspeed({**config, "pipeline": {"activation_checkpoint_interval": 0}},
                       {**pipeline, "activation_checkpoint_interval": 1}, 16, "ds.json")
    assert r.recompute == "full"
    with pytest.raises(SpecError, match="pipeline.activation_checkpoint_interval must be a whole number, got 1.5"):
        read_deepspeed({**config, "pipeline": {"activation_checkpoint_interval": 1.5}}, pipeline, 16, "ds.json")
    with pytest.raises(SpecError, match="ds_pipeline.json: partition_method 'parameters' is not read"):
        read_deepspeed(config, {**pipeline, "partition_method": "parameters"}, 16, "ds.json")
    r = read_deepspeed({**config, "sequence_parallel_size": 1, "pipeline": {"activation_checkpoint_interval": 0}},
                       {**pipeline, "partition_method": "type:transformer"}, 16, "ds.json")
    assert (r.pp, r.cp, r.recompute) == (2, 1, "none")


def test_toml_defaults_and_types() -> None:
    r = read_toml('[model]\nflavor = "70B"\n[parallelism]\ntensor_parallel_degree = 8\n'
                  'pipeline_parallel_degree = 4\n[training]\nlocal_batch_size = 8\nseq_len = 4096\n')
    assert (r.model_name, r.tp, r.pp, r.dp, r.zero, r.mbs, r.num_microbatches) == ("llama3-70b", 8, 4, None, 1, 1, 8)
    assert r.split == "torchtitan" and r.split_extra == (0, 1, 1, 1)  # torchtitan's defaults: 1 less at each end
    with pytest.raises(SpecError, match="pipeline_parallel_degree must be an integer"):
        read_toml("[parallelism]\npipeline_parallel_degree = 2.5\n")
    with pytest.raises(SpecError, match="not valid TOML"):
        read_toml("[parallelism\n")


def test_deepspeed_batch_hand_computed() -> None:
    """train_batch_size = micro x accumulation x dp: 256 = 2 x 8 x dp -> dp 16; without ds_pipeline.json the rest
    of the 64 GPUs is tensor parallelism (4), noted."""
    r = read_deepspeed({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
                        "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}, None, 64, "ds.json")
    assert (r.dp, r.tp, r.pp, r.mbs, r.num_microbatches, r.zero, r.bucket_size) == (16, 4, 1, 2, 8, 2, 500_000_000)
    assert any("no ds_pipeline.json" in n for n in r.notes)
    with pytest.raises(SpecError, match="pipeline section"):
        read_deepspeed({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "pipeline": {}}, None, 8, "d")
    # sizes as DeepSpeed's docs write them (5e8): a float of whole value is that number; 2.5 is not one
    r = read_deepspeed({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
                        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}, None, 64, "ds.json")
    assert r.bucket_size == 500_000_000
    with pytest.raises(SpecError, match="reduce_bucket_size must be a whole number, got 2.5"):
        read_deepspeed({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
                        "zero_optimization": {"stage": 1, "reduce_bucket_size": 2.5}}, None, 8, "ds.json")


def test_hostile_sizes_are_one_line_errors() -> None:
    """Numbers that would size an allocation are checked against specs/limits.py first; powers and shifts in
    $(( )) are not evaluated (they could build numbers of any size)."""
    from autotune.check.bash import Shell

    with pytest.raises(SpecError, match="exceeds the maximum"):
        read_megatron("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --pipeline-model-parallel-size "
                      "99999999999\n")
    with pytest.raises(SpecError, match="unrolls to more than"):
        parse_layout("(((t*1000)*1000)*1000)")
    with pytest.raises(SpecError, match="exceeds the maximum"):
        read_toml("[parallelism]\npipeline_parallel_degree = 1000000000000\n")
    shell = Shell()
    assert shell.arith("9**9**9**9") is None and shell.arith("1<<100000000") is None
    assert shell.arith("2 * 8 != 16") == 0


@pytest.mark.parametrize("fmt,name", [("cli", "launch_torchtitan.sh"), ("cli", "torchtitan_overrides.txt"),
                                      ("toml", "torchtitan.toml")])
def test_torchtitan_expert_parallel_degree_is_read_back(tmp_path, fmt, name):
    """An emitted torchtitan MoE launch (qwen3-30b-a3b, ep 8 over FSDP) reads back with its ep, and etp 1
    (torchtitan splits experts over ep alone once ep > 1), so check sizes the experts as the trainer does."""
    from autotune.catalog import load_model
    from autotune.check.understood import read_config
    from autotune.emit import EmitInput, emit
    from autotune.specs.job import JobSpec
    from autotune.specs.plan import Plan

    plan = Plan(tp=1, pp=1, dp=16, ep=8, mbs=1, num_microbatches=16, zero=3, recompute="full",
                layers_per_stage=(48,))
    inp = EmitInput(plan=plan, model=load_model("qwen3-30b-a3b"), job=JobSpec(global_batch=256, seq_len=4096,
                    trainer="torchtitan"), gpu="h100-sxm", gpus_per_node=8, step_time_s=2.5, peak_memory_gib=40.0,
                    mfu=0.4, mock_data=True)
    files = dict(emit("torchtitan", inp, torchtitan_format=fmt).files)
    path = tmp_path / name
    path.write_text(files[name])
    _, reading, _ = read_config(path, "torchtitan", 16)
    assert (reading.ep, reading.etp) == (8, 1)
    assert not any("expert_parallel_degree ignored" in n for n in reading.notes)
    if name == "launch_torchtitan.sh":  # its --config names torchtitan's config function
        assert reading.model_name == "qwen3-30b-a3b"
    if fmt == "cli":  # 0.3.x has no expert_tensor_parallel_degree (0.2.x's TOML had one): refused, not costed
        path.write_text(files[name].replace("--parallelism.expert_parallel_degree 8",
                                            "--parallelism.expert_parallel_degree 8 "
                                            "--parallelism.expert_tensor_parallel_degree 2"))
        with pytest.raises(SpecError, match="expert_tensor_parallel_degree: torchtitan 0.3.x has no such option"):
            read_config(path, "torchtitan", 16)


@pytest.mark.parametrize(("flags", "dispatcher", "noted"), [
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep", "deepep", False),
    ("--moe-token-dispatcher-type flex", "deepep", False),  # Megatron's default flex backend is deepep
    ("--moe-token-dispatcher-type alltoall", "alltoall", False),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", "alltoall", True),
    ("", "alltoall", True),  # Megatron's default dispatcher is allgather, which autotune does not price
])
def test_megatron_moe_dispatcher_is_read_back(flags: str, dispatcher: str, noted: bool) -> None:
    """The token dispatcher of an MoE script: DeepEP through the flex dispatcher, alltoall, and anything else
    read as alltoall with a note saying so."""
    r = read_megatron("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 128 "
                      f"--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2 {flags}\n")
    assert r.moe_dispatcher == dispatcher
    assert any("--moe-token-dispatcher-type" in n for n in r.notes) == noted, r.notes


@pytest.mark.parametrize(("flags", "message"), [
    ("--overlap-moe-expert-parallel-comm", "with the allgather (default) dispatcher: megatron-core overlaps the "
                                            "alltoall and flex dispatchers only"),
    ("--moe-token-dispatcher-type alltoall --overlap-moe-expert-parallel-comm --moe-shared-expert-overlap",
     "with --moe-shared-expert-overlap: megatron-core refuses the pair"),
    ("--moe-token-dispatcher-type alltoall --delay-wgrad-compute", "--delay-wgrad-compute without "
                                                                   "--overlap-moe-expert-parallel-comm"),
])
def test_the_expert_overlap_flags_megatron_core_refuses_are_refused(flags: str, message: str) -> None:
    """The rules beside --overlap-moe-expert-parallel-comm that no plan holds (reviewer: each got a normal
    report)."""
    with pytest.raises(SpecError, match=message.replace("(", "\\(").replace(")", "\\)")):
        read_megatron("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 128 --bf16 "
                      f"--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2 {flags}\n")
    r = read_megatron("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 128 --bf16 "
                      "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type "
                      "alltoall --overlap-moe-expert-parallel-comm --delay-wgrad-compute\n")
    assert r.ep_overlap


def test_earlier_torchtitan_keys_are_read_where_they_moved() -> None:
    """[training] batch_size and [experimental] pipeline/context degrees (torchtitan's earlier TOML layout) mean
    what 0.2.x's [training] local_batch_size and [parallelism] keys mean; they were ignored, so a tp2 pp2 cp2 run
    of local batch 2 was checked as tp 2 with batch 8 and called out of memory."""
    old = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 2\nseq_len = 8192\n'
           '[parallelism]\ntensor_parallel_degree = 2\n[experimental]\npipeline_parallel_degree = 2\n'
           'context_parallel_degree = 2\n')
    new = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\nseq_len = 8192\n'
           '[parallelism]\ntensor_parallel_degree = 2\npipeline_parallel_degree = 2\ncontext_parallel_degree = 2\n')
    a, b = read_toml(old), read_toml(new)
    assert (a.tp, a.pp, a.cp, a.mbs) == (b.tp, b.pp, b.cp, b.mbs) == (2, 2, 2, b.mbs)
    assert a.global_batch == b.global_batch and a.num_microbatches == b.num_microbatches
    assert sum("an earlier torchtitan's key" in n for n in a.notes) == 3
    with pytest.raises(SpecError, match=r"\[experimental\] pipeline_parallel_degree and \[parallelism\] "
                                        r"pipeline_parallel_degree both set"):
        read_toml(new + "[experimental]\npipeline_parallel_degree = 4\n")
    with pytest.raises(SpecError, match="pipeline_parallel_microbatch_size"):
        read_toml(new + "[experimental]\npipeline_parallel_microbatches = 4\n")


_LLAMA = ("--num-layers 80 --hidden-size 8192 --num-attention-heads 64 --swiglu --seq-length 4096 "
          "--max-position-embeddings 4096 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 ")


@pytest.mark.parametrize(("flags", "message"), [
    ("--num-layers-per-virtual-pipeline-stage 3", "20 layers of a pipeline stage are not a multiple of it"),
    ("--num-virtual-stages-per-pipeline-rank 3", "20 layers on a pipeline rank do not split over its 3 virtual"),
    ("--decoder-first-pipeline-num-layers 18 --decoder-last-pipeline-num-layers 18 "
     "--num-virtual-stages-per-pipeline-rank 4", "18 layers on a pipeline rank do not split over its 4 virtual"),
    ("--num-layers-per-virtual-pipeline-stage 5 --decoder-first-pipeline-num-layers 20",
     "cannot be combined with --decoder-first/last"),
    ("--num-layers-per-virtual-pipeline-stage 5 --num-virtual-stages-per-pipeline-rank 4", "takes one of them"),
    ("--recompute-granularity full", "needs --recompute-method"),
    ("--recompute-granularity full --recompute-method block", "needs --recompute-num-layers"),
    ("--bf16 --fp16", "--fp16 and --bf16"),
    ("--overlap-param-gather --overlap-grad-reduce", "without --use-distributed-optimizer"),
    ("--overlap-param-gather --use-distributed-optimizer", "without --overlap-grad-reduce"),
    ("--recompute-granularity selective --recompute-method uniform", "selective with --recompute-method"),
    ("--recompute-granularity selective --recompute-num-layers 2", "selective with --recompute-num-layers"),
    ("--recompute-granularity selective --distribute-saved-activations", "with --distribute-saved-activations"),
    ("--distribute-saved-activations", "only with tp > 1, --recompute-granularity full and a --recompute-method"),
    ("--use-precision-aware-optimizer --exp-avg-dtype bf16", "without --use-distributed-optimizer"),
    ("--use-distributed-optimizer --exp-avg-dtype bf16", "without --use-precision-aware-optimizer"),
    ("--use-distributed-optimizer --use-precision-aware-optimizer --exp-avg-dtype bf17", "one of fp32, fp16"),
    ("--use-distributed-optimizer --use-precision-aware-optimizer --optimizer sgd", "with adam only"),
    ("--tensor_model_parallel_size 8", "did you mean --tensor-model-parallel-size"),
    ("--sequence-paralel", "did you mean --sequence-parallel"),
    ("--use-distributed-optimiser", "did you mean --use-distributed-optimizer"),
    ("--cpu-offloading --cpu-offloading-num-layers 4 --pipeline-model-parallel-size 2",
     "--cpu-offloading with --pipeline-model-parallel-size 2: megatron-core refuses CPU offloading with pipeline"),
    ("--pipeline-model-parallel-size 1 --cpu-offloading --recompute-activations",
     "refuses CPU offloading with activation recomputation"),
    ("--pipeline-model-parallel-size 1 --cpu-offloading --cuda-graph-impl transformer_engine",
     "refuses CPU offloading with CUDA graphs"),
    ("--pipeline-model-parallel-size 1 --cpu-offloading --cpu-offloading-num-layers 80",
     "--cpu-offloading-num-layers 80: megatron-core offloads at most --num-layers 79 layers"),
    ("--window-size 128", "--window-size '128': expected two whole numbers, left and right"),
    ("--window-size 128,0 --window-attn-skip-freq '[1,0]'", r"--window-attn-skip-freq '\[1,0\]' gives 2 layers"),
])
def test_megatron_refusals_are_refused_here(flags: str, message: str) -> None:
    """What Megatron refuses at start-up (validate_args, megatron-core's TransformerConfig and
    get_num_layers_to_build) is a one-line error, not a costed misreading of the script."""
    with pytest.raises(SpecError, match=message) as err:
        read_megatron(_LLAMA + flags + "\n")
    assert "\n" not in str(err.value)


_AWARE = "--use-distributed-optimizer --use-precision-aware-optimizer"


@pytest.mark.parametrize("flags, states, grads, noted", [
    ("", "fp32", "fp32", ""),
    ("--grad-reduce-in-bf16", "fp32", "bf16", ""),
    (_AWARE, "fp32", "fp32", "costed as fp32 Adam states (its 16-bit master remainders"),
    (_AWARE + " --fp8-recipe tensorwise", "fp32", "fp32", "costed as fp32 Adam states"),
    (_AWARE + " --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", "bf16", "fp32", ""),
    # DeepSeek-V3's recipe: bf16 main gradients keep the buffers in bf16 without --grad-reduce-in-bf16
    (_AWARE + " --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --main-grads-dtype bf16", "bf16", "bf16", ""),
    # another fp8 recipe: megatron-core keeps whole fp32 master weights and an fp32 gradient copy
    (_AWARE + " --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --fp8-format hybrid --fp8-recipe tensorwise",
     "bf16-moments", "fp32", ""),
    (_AWARE + " --exp-avg-dtype fp8 --exp-avg-sq-dtype bf16", "bf16", "fp32", "Adam moments of 1 and 2 bytes"),
    (_AWARE + " --exp-avg-dtype bf16", "bf16", "fp32", "Adam moments of 2 and 4 bytes"),
    (_AWARE + " --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --use-megatron-fsdp", "fp32", "fp32",
     "with Megatron FSDP: costed as fp32 Adam states"),
])
def test_megatron_optimizer_precision_is_read_back(flags: str, states: str, grads: str, noted: str) -> None:
    r = read_megatron(_LLAMA + flags + "\n")
    assert (r.optimizer_states, r.grad_reduce) == (states, grads)
    assert any(noted in n for n in r.notes) if noted else not any("Adam" in n for n in r.notes)


def test_megatron_valid_virtual_stages_still_read() -> None:
    assert read_megatron(_LLAMA + "--num-layers-per-virtual-pipeline-stage 5\n").vpp == 4
    assert read_megatron(_LLAMA + "--num-virtual-stages-per-pipeline-rank 4\n").vpp == 4
    r = read_megatron(_LLAMA + "--checkpoint-activations\n")  # the legacy flag means uniform
    assert (r.recompute, r.recompute_layers) == ("full", None)


def test_deepspeed_refuses_both_precisions_and_notes_offload() -> None:
    base = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1}
    with pytest.raises(SpecError, match="both true"):
        read_deepspeed({**base, "bf16": {"enabled": True}, "fp16": {"enabled": True}}, None, 8, "ds.json")
    r = read_deepspeed({**base, "bf16": {"enabled": True},
                        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, None, 8, "ds.json")
    assert any("offload_optimizer.device cpu" in n for n in r.notes)


def test_recompute_modules_take_a_list_as_in_megatron() -> None:
    r = read_megatron(_LLAMA + "--recompute-granularity selective --recompute-modules moe_act layernorm "
                      "--use-distributed-optimizer\n")
    assert not [n for n in r.notes if "stray" in n] and r.zero == 1
    assert any("--recompute-modules moe_act layernorm" in n for n in r.notes)


_MOE = _LLAMA + "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 4096 "


@pytest.mark.parametrize(("flags", "message"), [
    ("--moe-router-group-topk 2", "--moe-router-group-topk needs --moe-router-num-groups"),
    ("--moe-router-num-groups 3 --moe-router-group-topk 2", "the groups must divide the 8 experts"),
    ("--moe-router-num-groups 4 --moe-router-group-topk 5", "the groups must divide the 8 experts"),
    ("--moe-router-enable-expert-bias", "needs --moe-router-score-function sigmoid"),
    ("--mtp-num-layers 1 --recompute-granularity full --recompute-method uniform --recompute-num-layers 2",
     "MTP block asserts recompute_num_layers 1"),
])
def test_megatron_moe_refusals_are_refused_here(flags: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        read_megatron(_MOE + flags + "\n")
    r = read_megatron(_MOE + "--moe-router-num-groups 4 --moe-router-group-topk 2 --moe-router-score-function sigmoid "
                      "--moe-router-enable-expert-bias\n")
    assert (r.model_fields["moe_router_groups"], r.model_fields["moe_router_group_topk"],
            r.model_fields["router_bias"]) == (4, 2, True)


def test_only_slips_of_known_flags_are_refused() -> None:
    """A flag one letter (or an underscore) away from one the reader knows is a slip Megatron's parser refuses;
    every megatron-core config field spelled as a flag that the reader does not know stays an ignored note (real
    flags sit close to known ones: --fp4-recipe beside --fp8-recipe)."""
    import dataclasses

    from autotune.check.megatron_args import KNOWN_FLAGS
    from autotune.check.reading import misspelling_of

    core = pytest.importorskip("megatron.core.transformer.transformer_config")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    flags = {"--" + f.name.replace("_", "-") for config in (core.TransformerConfig, core.MLATransformerConfig,
                                                            OptimizerConfig, DistributedDataParallelConfig)
             for f in dataclasses.fields(config)}
    assert len(flags) > 300
    assert [f for f in sorted(flags - KNOWN_FLAGS) if misspelling_of(f, KNOWN_FLAGS)] == []
    r = read_megatron(_LLAMA + "--fp4-recipe nvfp4 --moe-enable-deepep\n")
    assert any("unknown flag --fp4-recipe ignored" in n for n in r.notes)
    assert any("--moe-enable-deepep is a deprecated spelling" in n for n in r.notes)
    assert misspelling_of("--bf61", KNOWN_FLAGS) is None
    assert misspelling_of("--num-layer", KNOWN_FLAGS) == "--num-layers"


def test_vocab_size_without_null_tokenizer_is_noted() -> None:
    r = read_megatron(_LLAMA + "--vocab-size 32000 --tokenizer-type HuggingFaceTokenizer\n")
    assert any("only Megatron's NullTokenizer reads it" in n for n in r.notes)
    assert "vocab_size" not in (r.model_fields or {})


def test_torchtitan_slips_of_known_keys_are_refused() -> None:
    with pytest.raises(SpecError, match="did you mean parallelism.tensor_parallel_degree"):
        read_toml('[model]\nflavor = "70B"\n[parallelism]\ntensor_paralel_degree = 8\n')
    r = read_toml('[model]\nflavor = "70B"\n[parallelism]\nfsdp_bucket_cap_mb = 8\n')  # unknown, not a slip
    assert any("fsdp_bucket_cap_mb ignored" in n for n in r.notes)


def test_colon_defaults_are_followed_and_unset_values_named() -> None:
    """`: ${TP:=8}` sets a default as bash does; a flag whose variable the script never sets has no value, which
    is said as such (autotune reads a script with an empty environment), not as a garbled number."""
    body = ("--num-layers 80 --hidden-size 8192 --num-attention-heads 64 --seq-length 4096 "
            "--max-position-embeddings 4096 --tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP")
    r = read_megatron(': ${TP:=8}\n: "${PP:=4}"\n: "${DATA:?set DATA}"\ntorchrun pretrain_gpt.py ' + body + "\n")
    assert (r.tp, r.pp) == (8, 4) and not [n for n in r.notes if "DATA" in n]
    with pytest.raises(SpecError, match="--tensor-model-parallel-size has no value; .* empty environment") as err:
        read_megatron("torchrun pretrain_gpt.py " + body + "\n")
    assert "(${TP:-8} or : ${TP:=8})" in str(err.value)
    r = read_megatron(': "${NAME^^}"\nTP=8\nPP=4\ntorchrun pretrain_gpt.py ' + body + "\n")
    assert any("${NAME^^}: not an expansion autotune follows" in n for n in r.notes)  # kept, unlike a guard's


def test_deepspeed_takes_one_batch_key_as_deepspeed_does() -> None:
    """DeepSpeed's _set_batch_related_parameters: the micro-batch alone or the train batch alone means gradient
    accumulation 1; neither is an error."""
    r = read_deepspeed({"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True}}, None, 8, "ds.json")
    assert (r.mbs, r.num_microbatches, r.global_batch, r.dp) == (4, 1, 32, 8)
    r = read_deepspeed({"train_batch_size": 64, "bf16": {"enabled": True}}, None, 8, "ds.json")
    assert (r.mbs, r.num_microbatches, r.global_batch) == (8, 1, 64)
    with pytest.raises(SpecError, match="neither train_batch_size nor train_micro_batch_size_per_gpu"):
        read_deepspeed({"gradient_accumulation_steps": 4}, None, 8, "ds.json")


def test_rule_messages_name_the_configs_flags() -> None:
    """check_plan speaks autotune's plan (ep, micro-batch); a check of a config appends the config's own names of
    the words it uses, longest match first ("zero 3", not "zero")."""
    from autotune.check.reading import in_config_terms

    assert in_config_terms("ep 256 must divide num_experts 128", "megatron") == (
        "ep 256 must divide num_experts 128 [in the megatron config: ep is --expert-model-parallel-size, "
        "num_experts is --num-experts]")
    assert in_config_terms("zero 3 with pp 4", "megatron").endswith(
        "[in the megatron config: pp is --pipeline-model-parallel-size, zero 3 is --use-torch-fsdp2/"
        "--use-megatron-fsdp]")
    assert in_config_terms("global batch 64 is not divisible by micro-batch 3", "deepspeed").endswith(
        "global batch is train_batch_size, micro-batch is train_micro_batch_size_per_gpu]")
    assert in_config_terms("--tensor-model-parallel-size 3 does not divide 8", "megatron") == (
        "--tensor-model-parallel-size 3 does not divide 8")


def test_a_pipeline_size_that_does_not_divide_the_layers_is_named_first() -> None:
    """pp 3 with 80 layers and --num-layers-per-virtual-pipeline-stage: the layers not splitting over pp is the
    problem Megatron reports, not the virtual stage size."""
    flags = _LLAMA.replace("--pipeline-model-parallel-size 4", "--pipeline-model-parallel-size 3")
    with pytest.raises(SpecError, match="--num-layers 80 does not split over --pipeline-model-parallel-size 3"):
        read_megatron(flags + "--num-layers-per-virtual-pipeline-stage 5\n")


def test_moe_enable_deepep_is_read_as_megatron_core_takes_it() -> None:
    """The deprecated switch means the DeepEP backend of the flex dispatcher; megatron-core refuses it with any
    other dispatcher."""
    moe = _LLAMA + "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 --moe-enable-deepep "
    assert read_megatron(moe + "--moe-token-dispatcher-type flex\n").moe_dispatcher == "deepep"
    with pytest.raises(SpecError, match="--moe-enable-deepep needs --moe-token-dispatcher-type flex"):
        read_megatron(moe + "--moe-token-dispatcher-type alltoall\n")


@pytest.mark.parametrize("bf16,zero,expected", [
    ({"enabled": True}, 1, "fp32"),
    ({"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, 1, "bf16"),
    ({"enabled": True, "bf16_master_weights_and_grads": True}, 2, "fp32 noted"),
    ({"enabled": True, "bf16_optimizer_states": True}, 1, "needs bf16.bf16_master_weights_and_grads"),
    ({"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, 0, "need ZeRO stage"),
    ({"enabled": True, "bf16_master_weights_and_grads": "true", "bf16_optimizer_states": 1}, 1, "bf16"),
    ({"enabled": True, "bf16_optimizer_state": True}, 1, "not a key of DeepSpeed's bf16 section"),
])
def test_deepspeed_bf16_master_weights_and_states(bf16: dict, zero: int, expected: str) -> None:
    """DeepSpeed's bf16 master weights and Adam states read back as 'bf16' states; what its config check refuses
    (runtime/config.py) is refused in one line; master weights alone are costed as fp32 states, with a note."""
    from autotune.check.deepspeed_json import optimizer_states

    notes: list[str] = []
    config = {"bf16": bf16, "zero_optimization": {"stage": zero}}
    if expected.startswith(("need", "not a key")):
        with pytest.raises(SpecError, match=expected):
            optimizer_states(config, zero, notes)
        return
    assert optimizer_states(config, zero, notes) == expected.split()[0]
    assert bool(notes) == expected.endswith("noted")


@pytest.mark.parametrize("tree,fmt,expected", [
    ({}, "cli", "fp32"),
    ({"optimizer": {"implementation": "fused_opt_states_bf16"}}, "cli", "bf16-moments"),
    ({"optimizer": {"implementation": "fused_opt_states_bf16"}}, "toml", "torchtitan 0.2.x takes"),
    ({"optimizer": {"implementation": "fused_bf16"}}, "cli", "optimizer.implementation 'fused_bf16'"),
    ({"training": {"mixed_precision_reduce": "bfloat16"}}, "cli", "reduces in float32 only"),
])
def test_torchtitan_optimizer_and_reduce_dtypes(tree: dict, fmt: str, expected: str) -> None:
    """torchtitan's bf16 Adam moments read back; what its config Literals refuse is refused in one line."""
    from autotune.check.torchtitan_settings import optimizer_states as _optimizer_states

    if expected in ("fp32", "bf16-moments"):
        assert _optimizer_states(tree, fmt) == expected
        return
    with pytest.raises(SpecError, match=expected):
        _optimizer_states(tree, fmt)


@pytest.mark.parametrize(("flags", "kernel", "noted"), [
    ("", "unfused", True),  # Megatron-LM's default: no fusion
    ("--cross-entropy-loss-fusion", "native", False),
    ("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te", "te", False),
    ("--cross-entropy-fusion-impl te", "unfused", True),  # the impl alone fuses nothing
])
def test_megatron_loss_fusion_is_read_back(flags: str, kernel: str, noted: bool) -> None:
    r = read_megatron(f"--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 128 {flags}\n")
    assert r.cross_entropy == kernel
    assert any("--cross-entropy-loss-fusion" in n for n in r.notes) == noted, r.notes


def test_an_unknown_loss_fusion_impl_is_refused() -> None:
    with pytest.raises(SpecError, match="--cross-entropy-fusion-impl triton: Megatron-LM takes native or te"):
        read_megatron("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --cross-entropy-loss-fusion "
                      "--cross-entropy-fusion-impl triton\n")


def test_a_ds_pipeline_model_key_autotune_never_writes_is_refused() -> None:
    """ds_pipeline.json's model block is autotune's own: num_kv_heads beside num_key_value_heads was ignored and the
    file checked as the shape it did not say (user-tester, 2026-11-25)."""
    from autotune.check.deepspeed_json import _model_fields

    block = {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128, "ffn_hidden_size": 14336, "vocab_size": 128256, "activation": "swiglu",
             "norm": "rmsnorm"}
    assert _model_fields(block)["num_kv_heads"] == 8
    with pytest.raises(SpecError, match="model: num_kv_heads is not a key of the model block; did you mean "
                                        "num_key_value_heads"):
        _model_fields({**block, "num_kv_heads": 3})
    with pytest.raises(SpecError, match="model: colour is not a key of the model block \\(activation, bias"):
        _model_fields({**block, "colour": "red"})


def test_hsdp_shards_its_state_over_the_shard_degree() -> None:
    """torchtitan's HSDP (replicate x shard) shards the state over the shard degree only: the reading gives its
    replicas, whose shard group check costs the memory with, and says so (user-tester, 2026-11-25)."""
    r = read_toml('[model]\nname = "llama3"\nflavor = "70B"\n[training]\nlocal_batch_size = 8\nseq_len = 8192\n'
                  "[parallelism]\ndata_parallel_replicate_degree = 4\ndata_parallel_shard_degree = 2\n"
                  "tensor_parallel_degree = 8\n")
    assert r.dp == 8 and r.zero == 3 and r.shard_replicas == 4
    assert any(n.startswith("HSDP (replicate 4 x shard 2): the state is sharded over the shard degree only, as "
                            "costed for memory") for n in r.notes), r.notes


def test_megatron_spellings_a_user_tester_met() -> None:
    """--use-custom-fsdp (Megatron FSDP's name before 0.14) is read as --use-megatron-fsdp; --fp8-param-gather is
    known, with a note; a lowercase --normalization is refused as Megatron-LM's argparse refuses it; the
    account-for split error counts the embedding and loss (user-tester, 2026-11-25)."""
    base = "--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 128 "
    r = read_megatron(base + "--use-custom-fsdp --data-parallel-sharding-strategy optim_grads_params --fp8-param-gather\n")
    assert r.zero == 3
    assert r.overlap_grad_reduce  # Megatron-FSDP sharding gradients forces the overlap: the old name says so too
    assert any("deprecated spelling of --use-megatron-fsdp" in n for n in r.notes)
    assert any("--fp8-param-gather" in n for n in r.notes)
    with pytest.raises(SpecError, match="--normalization rmsnorm: Megatron-LM takes LayerNorm or RMSNorm"):
        read_megatron(base + "--normalization rmsnorm\n")
    with pytest.raises(SpecError, match=r"--num-layers 4 \+ 2 \(embedding/loss\) does not split over"):
        read_megatron(base + "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1 "
                      "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split\n")


def test_torchtitans_zbv_split_is_evened_to_two_chunks_a_rank() -> None:
    """torchtitan splits Llama 3 8B over 8 V stages as [4, 4, 4, 4, 4, 4, 4, 4] plus the embedding and head,
    which gives ranks 7, 9, 8, 8 layers; autotune's V-Half holds two equal chunks a rank, so the reading moves a
    layer between the odd ranks, 8, 8, 8, 8, and says so (it refused the config, user-tester 2026-11-25)."""
    from autotune.check.torchtitan_toml import per_rank

    assert per_rank([3, 4, 4, 4, 4, 4, 5, 4], 4, "v-half") == (8, 8, 8, 8)  # the V gives ranks 7, 9, 8, 8
    assert per_rank([3, 4, 4, 4, 4, 4, 5, 4], 4, "interleaved") == (7, 8, 9, 8)  # looped: as they come
    r = read_toml('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 8\nseq_len = 8192\n'
                  '[parallelism]\ndata_parallel_shard_degree = 8\npipeline_parallel_degree = 4\n'
                  'pipeline_parallel_schedule = "ZBVZeroBubble"\n')
    assert r.schedule == "v-half" and any("evened to two equal chunks" in n for n in r.notes)


def test_flags_costed_otherwise_are_said_once_each() -> None:
    """A --tp-comm-overlap-cfg file changes which userbuffers Transformer Engine registers, which autotune costs
    as TE's defaults: said, as the batch ramp-up and FP8 parameter gathers are; none of them without the flag."""
    base = "--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 128 "
    r = read_megatron(base + "--tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap "
                      "--tp-comm-overlap-cfg ub.yaml --rampup-batch-size 16 16 1000 --fp8-param-gather\n")
    said = [n for n in r.notes if n.startswith(("--tp-comm-overlap-cfg:", "--rampup-batch-size:", "--fp8-param"))]
    assert len(said) == 3 and any("the file's own methods are not read" in n for n in said)
    assert not [n for n in read_megatron(base).notes if "costed" in n and "--tp-comm-overlap-cfg" in n]


def test_a_negative_deepspeed_size_is_named_as_negative(tmp_path) -> None:
    """train_micro_batch_size_per_gpu -2 said 'must be a whole number, got -2' (user-tester)."""
    from autotune.check.deepspeed_json import _size
    with pytest.raises(SpecError, match=r"x: train_micro_batch_size_per_gpu must be >= 1, got -2$"):
        _size({"train_micro_batch_size_per_gpu": -2}, "train_micro_batch_size_per_gpu", "x")
    with pytest.raises(SpecError, match=r"x: reduce_bucket_size must be a whole number, got \"big\"$"):
        _size({"reduce_bucket_size": "big"}, "reduce_bucket_size", "x")


def test_megatron_flags_a_user_tester_found_unknown_are_known() -> None:
    """Megatron-LM arguments.py flags that were reported as unknown: the neutral ones are read silently, those
    that change the step are named with how they are costed."""
    from autotune.check.megatron_args import reading_from_args

    base = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "4096"]
    neutral = ["--exit-signal-handler", "--dist-ckpt-strictness", "log_all", "--align-param-gather", "--profile",
               "--profile-ranks", "0", "1", "--profile-step-start", "10", "--rerun-mode", "disabled"]
    r = reading_from_args(base + neutral, [])
    assert not any("unknown flag" in n or "ignored" in n for n in r.notes), r.notes
    named = reading_from_args(base + ["--enable-cuda-graph", "--use-tp-pp-dp-mapping"], [])
    assert [n.split(":")[0] for n in named.notes if n.startswith("--")] == [
        "--enable-cuda-graph", "--use-tp-pp-dp-mapping"]
    # megatron-core 0.16 refuses --delay-wgrad-compute without the expert overlap (test_the_expert_overlap_flags...)
    with pytest.raises(SpecError, match="--delay-wgrad-compute without --overlap-moe-expert-parallel-comm"):
        reading_from_args(base + ["--delay-wgrad-compute"], [])


def test_routing_imbalance_comes_from_the_flag_the_config_or_the_header() -> None:
    """--moe-imbalance wins, noted where it replaces the config's forced balanced routing; the config's own comes
    next; autotune's header (the run's, which no flag sets) last, noted; else the cost model's default (None)."""
    from dataclasses import replace as swap

    from autotune.check.reading import Reading
    from autotune.check.understood import _routing

    plain = Reading(trainer="megatron")
    cases = [(swap(plain, moe_imbalance=1.0), 2.0, 2.0, "--moe-imbalance 2 replaces the config's own routing (1"),
             (swap(plain, header_imbalance=1.1234567), 2.0, 2.0, None),
             (swap(plain, moe_imbalance=1.0, header_imbalance=1.5), None, 1.0, None),
             (swap(plain, header_imbalance=1.1234567), None, 1.1234567, "routing imbalance 1.1234567 from autotune's"),
             (plain, None, None, None)]
    for reading, given, expected, note in cases:
        notes: list[str] = []
        assert _routing(reading, given, notes) == expected
        assert [n[:len(note)] for n in notes] == ([note] if note else [])


def test_partial_rope_and_a_parallel_block_are_read_back() -> None:
    """--rotary-percent (Megatron-LM) and ds_pipeline.json's rotary_fraction / parallel_block (emit/deepspeed.py's
    model block) come back as the model's; a share outside (0, 1] is refused in the flag's own terms."""
    flags = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 128 "
             "--use-rotary-position-embeddings")
    assert read_megatron(f"{flags} --rotary-percent 0.25\n").model_soft["rotary_fraction"] == 0.25
    for bad in ("1.5", "0", "nan"):
        with pytest.raises(SpecError, match=f"--rotary-percent '{bad}': expected a share of each head in"):
            read_megatron(f"{flags} --rotary-percent {bad}\n")
    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
              "bf16": {"enabled": True}}
    model = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 8,
             "head_dim": 128, "ffn_hidden_size": 4096, "vocab_size": 50432, "activation": "gelu", "norm": "layernorm",
             "position_embedding": "rope", "rotary_fraction": 0.25, "parallel_block": True}
    pipeline = {"num_stages": 2, "mpu": {"tensor_model_parallel_size": 1}, "model": model}
    r = read_deepspeed(config, pipeline, 16, "ds.json")
    assert (r.model_fields["parallel_block"], r.model_soft["rotary_fraction"]) == (True, 0.25)
    with pytest.raises(SpecError, match="rotary_fraction must be a share of each head in"):
        read_deepspeed(config, {**pipeline, "model": {**model, "rotary_fraction": 2}}, 16, "ds.json")
    with pytest.raises(SpecError, match="parallel_block must be true or false"):
        read_deepspeed(config, {**pipeline, "model": {**model, "parallel_block": "yes"}}, 16, "ds.json")


@pytest.mark.parametrize(("flags", "window", "layers"), [
    ("--window-size 128,0", 128, 80), ("--window-size 128,0 --window-attn-skip-freq 2", 128, 40),
    ("--window-size '(4096, 0)' --window-attn-skip-freq 4", 4096, 60),
    ("--window-size 128,0 --window-attn-skip-freq '[1,1,1,0]*20'", 128, 60), ("--window-size=-1,0", 0, 0),
])
def test_megatron_attention_window_is_read(flags: str, window: int, layers: int) -> None:
    """--window-size LEFT,RIGHT and --window-attn-skip-freq (TransformerConfig fields: an int N windows layer n
    unless n % N == 0, 1-based; a list marks windowed layers with 1), read as the model's window on those
    layers (user-tester: 'unknown flag', the attention costed as full in every layer); -1 is no window."""
    fields = read_megatron(_LLAMA + flags + "\n").model_fields
    assert (fields.get("sliding_window", 0), fields.get("sliding_window_layers", 0)) == (window, layers)


def test_offloading_and_cuda_graphs_are_noted_as_not_costed() -> None:
    """TransformerConfig's offloading and CUDA-graph fields change the run's memory and time; they were read as
    'unknown flags' that 'do not change the plan' (user-tester). Now each says what is costed instead."""
    notes = read_megatron(_LLAMA + "--pipeline-model-parallel-size 1 --cpu-offloading --cpu-offloading-num-layers 3\n"
                          ).notes + read_megatron(_LLAMA + "--fine-grained-activation-offloading --offload-modules "
                                                           "core_attn\n").notes
    assert not any("unknown flag" in n for n in notes)
    assert any(n.startswith("--cpu-offloading: layers' activations") for n in notes)
    assert any(n.startswith("--fine-grained-activation-offloading: the --offload-modules'") for n in notes)
    notes = read_megatron(_LLAMA + "--cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router\n").notes
    assert any(n.startswith("--cuda-graph-impl: CUDA graphs replay") for n in notes)
    assert not any("unknown flag" in n or "cuda-graph" in n for n in read_megatron(
        _LLAMA + "--cuda-graph-impl none\n").notes)

