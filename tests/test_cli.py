"""The command line of ../shared/CLI.md: help, catalogs, estimate (human and JSON), --plan, and error paths."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli.options import one, parse_choice_list, parse_int_list
from autotune.errors import SpecError

REPO = Path(__file__).resolve().parent.parent
H100 = REPO / "profiles" / "hardware" / "h100-sxm.json"

# llama3-70b (64 heads, 8 kv heads) on 64 H100s: tp 8 x pp 4 leaves dp 2 and 32 micro-batches of 1.
JOB = ("--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "64", "--seq-len", "8192")
PLAN = ("--tp", "8", "--pp", "4")
CLI_MD_KEYS = {"plan", "step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "peak_memory_gib",
               "memory_per_stage_gib", "breakdown"}
CLI_MD_PLAN_KEYS = {"tp", "pp", "dp", "cp", "mbs", "num_microbatches", "vpp", "schedule", "recompute", "zero",
                    "sequence_parallel", "vocab", "layers_per_stage"}
CLI_MD_BREAKDOWN_KEYS = {"compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_exposed_s", "bubble_s"}

# Meta-Llama-3.1-8B's config.json as the hub ships it: many keys autotune ignores.
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
}


def _estimate_json(cli, *args: str) -> dict:
    result = cli("estimate", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ------------------------------------------------------------------------------------------------ help
@pytest.mark.parametrize("command", [[], ["models"], ["hardware"], ["estimate"], ["plan"]])
def test_help_of_every_command(cli, command):
    result = cli(*command, "--help")
    assert result.exit_code == 0
    assert "Usage" in result.stdout


def test_help_through_main_exits_0(autotune_proc):
    for args in (["--help"], ["estimate", "--help"], ["plan", "--help"], []):  # a bare `autotune` prints the help too
        proc = autotune_proc(*args)
        assert proc.returncode == 0, proc.stderr
        assert "Usage" in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [("models",), ("hardware", "--json"), ("--help",), ("plan", "--help"),
                                  ("estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                                   "--global-batch", "32", "--seq-len", "4096", "--tp", "1", "--pp", "8", "--brief")])
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly_with_exit_0(args):
    """`autotune ... | head -1`: a closed stdout was a silent exit 1 (rich's and click's broken-pipe handlers), and
    only when the output outgrew the pipe's buffer, so `set -o pipefail` scripts failed at random (user-tester).
    Here the read end is closed before the command writes anything: every write meets a broken pipe."""
    proc = subprocess.Popen([sys.executable, "-m", "autotune", *args], cwd=Path(__file__).resolve().parent.parent,
                            env={**os.environ, "COLUMNS": "120"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err == b""


# ------------------------------------------------------------------------------------------------ catalogs
def test_models_lists_the_catalog(cli):
    result = cli("models")
    assert result.exit_code == 0
    assert "llama3-70b" in result.stdout and "gpt3-175b" in result.stdout


def test_models_piped_keeps_every_column_and_source(cli):
    """Piped at 120 characters the table once cut its source column to one letter: the shapes stay a table and
    each source follows on lines of its own, its first clause whole (its parentheses closed)."""
    out = cli("models").stdout
    header = next(line for line in out.splitlines() if "name" in line and "params B" in line)
    assert "…" not in out and len(header) <= 120
    sources = out[out.index("Sources"):]
    assert "gpt3-175b:" in sources and "Brown et al., 'Language Models are Few-Shot Learners'" in sources
    gemma2 = " ".join(sources[sources.index("gemma2-9b:"):sources.index("gemma3-27b:")].split())
    assert gemma2.count("(") == gemma2.count(")") == 1


def test_source_clause_stops_at_the_first_semicolon_outside_parentheses():
    from autotune.render.catalogs import source_clause
    assert source_clause("A (x; y); z") == "A (x; y)"
    assert source_clause("A; B") == "A" and source_clause(" A ") == "A"


def test_models_json(cli):
    models = {m["name"]: m for m in json.loads(cli("models", "--json").stdout)["models"]}
    assert models["llama3-70b"]["num_layers"] == 80
    assert models["llama3-70b"]["params_B"] == pytest.approx(70.6, abs=0.1)  # the published 70.6B
    assert "num_experts" not in models["llama3-70b"]  # MoE fields only for MoE models
    ds = models["deepseek-v3"]  # DeepSeek-V3's report: 671B total, 37B activated per token
    assert (ds["num_experts"], ds["moe_top_k"], ds["first_dense_layers"]) == (256, 8, 3)
    assert ds["active_params_B"] == pytest.approx(37, rel=0.02) and ds["published_active_params_B"] == 37
    # its multi-token prediction module: one MoE layer, eh_proj and three norms (costmodel/mtp.py)
    assert ds["mtp_layers"] == 1 and ds["mtp_params_B"] == pytest.approx(11.61, abs=0.01)
    assert "mtp_layers" not in models["qwen3-30b-a3b"]
    maverick = models["llama4-maverick"]  # every second layer MoE
    assert (maverick["moe_layer_freq"], maverick["published_params_B"]) == (2, 400)
    # OpenAI's card counts 5.13B active without the input embedding (201088 x 2880 = 0.579B): both are given
    oss = models["gpt-oss-120b"]
    assert oss["active_params_B_without_input_embedding"] == pytest.approx(5.13, rel=0.01)
    assert oss["active_params_B"] - oss["active_params_B_without_input_embedding"] == pytest.approx(0.579, abs=1e-3)


def test_models_shows_how_a_config_json_is_read(cli, tmp_path):
    """`autotune models FILE ...` reads each as plan and estimate do and says what the cost model takes, the
    keys a config.json leaves implicit included (user-tester: nothing showed StarCoder2 read as a gated RMSNorm
    model of 21.7B); a catalog name beside it is shown too, and --json carries the same reading."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "starcoder2", "hidden_act": "gelu_pytorch_tanh", "hidden_size": 6144,
                                "intermediate_size": 24576, "num_attention_heads": 48, "num_key_value_heads": 4,
                                "num_hidden_layers": 40, "vocab_size": 49152, "norm_type": "layer_norm",
                                "use_bias": True, "sliding_window": 4096, "tie_word_embeddings": False}))
    out = " ".join(cli("models", str(path), "llama3-8b").stdout.split())
    assert ("plain GeLU MLP, LayerNorm, biases all, 48 query / 4 key-value heads of 128, RoPE, untied embeddings, "
            "4096-token window on 40 layers; 15.96B parameters") in out
    assert "llama3-8b: SwiGLU MLP, RMSNorm, biases none" in out and "gpt3-175b" not in out
    doc = json.loads(cli("models", str(path), "--json").stdout)["models"]
    assert [(m["activation"], m["norm"], m["bias"], m["params_B"]) for m in doc] == [
        ("gelu", "layernorm", "all", pytest.approx(15.96, abs=0.01))]
    assert "Read as" not in cli("models").stdout  # the catalog listing alone stays as it was


def test_hardware_lists_the_catalog(cli):
    result = cli("hardware")
    assert result.exit_code == 0
    for name in ("v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "mi300x"):  # CLI.md's list
        assert name in result.stdout


def test_hardware_json(cli):
    gpus = {g["name"]: g for g in json.loads(cli("hardware", "--json").stdout)["hardware"]}
    assert gpus["h100-sxm"]["bf16_TFLOPs"] == 989.0
    assert gpus["h100-sxm"]["gpus_per_node"] == 8


# ------------------------------------------------------------------------------------------------ estimate
def test_estimate_human_output(cli):
    result = cli("estimate", *JOB, *PLAN, "--ops")
    assert result.exit_code == 0
    out = result.stdout
    for phrase in ("step time", "MFU", "tokens/s", "peak memory", "pipeline bubble", "E+20", "20+H",
                   "tensor contractions (gemm)", "fits"):
        assert phrase in out
    assert max(len(line) for line in out.splitlines()) <= 120  # the fixed width when not a terminal


def test_estimate_json_has_the_cli_md_fields(cli):
    doc = _estimate_json(cli, *JOB, *PLAN)
    assert CLI_MD_KEYS <= doc.keys()
    assert CLI_MD_PLAN_KEYS <= doc["plan"].keys()
    assert CLI_MD_BREAKDOWN_KEYS <= doc["breakdown"].keys()
    assert doc["plan"]["dp"] == 2 and doc["plan"]["num_microbatches"] == 32  # derived from --gpus and the batch
    assert doc["plan"]["sequence_parallel"] is True  # on by default when tp > 1
    assert len(doc["memory_per_stage_gib"]) == len(doc["stages"]) == 4
    assert doc["peak_memory_gib"] == max(doc["memory_per_stage_gib"])
    assert sum(doc["breakdown"].values()) == pytest.approx(doc["step_time_s"], rel=1e-5)
    assert set(doc["operators"]) == {"gemm", "attention", "norm", "elementwise", "vocab"}
    assert doc["stages"][0]["has_embedding"] and doc["stages"][-1]["has_head"]


def test_estimate_json_is_byte_identical_across_runs(cli):
    first = cli("estimate", *JOB, *PLAN, "--json").stdout
    assert first == cli("estimate", *JOB, *PLAN, "--json").stdout
    json.loads(first)  # and it is exactly one JSON object


def test_estimate_reports_a_plan_that_does_not_fit(cli):
    args = (*JOB, "--tp", "8", "--pp", "1")  # 70B on one 8-GPU tp group without ZeRO cannot fit in 76 GiB
    assert "NO:" in cli("estimate", *args).stdout
    assert _estimate_json(cli, *args)["fits"] is False


def test_estimate_options_reach_the_plan(cli):
    doc = _estimate_json(cli, *JOB, *PLAN, "--vpp", "2", "--recompute", "full", "--recompute-layers", "5",
                         "--zero", "1", "--mbs", "2", "--no-sequence-parallel", "--bucket-size", "1000000")
    plan = doc["plan"]
    assert plan["schedule"] == "interleaved"  # the default once vpp > 1
    assert (plan["recompute"], plan["recompute_layers"], plan["zero"]) == ("full", 5, 1)
    assert (plan["mbs"], plan["num_microbatches"], plan["bucket_size"]) == (2, 16, 1_000_000)
    assert plan["sequence_parallel"] is False


def test_layers_per_stage_pin(cli):
    doc = _estimate_json(cli, *JOB, *PLAN, "--layers-per-stage", "19,21,21,19", "--vocab", "balanced")
    assert doc["plan"]["layers_per_stage"] == [19, 21, 21, 19]


def test_gpus_per_node_override(cli):
    # gpt3-175b has 96 heads: tp 16 spans two 8-GPU nodes unless the node is declared larger.
    args = ("--model", "gpt3-175b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "64", "--seq-len",
            "2048", "--tp", "16", "--pp", "4")
    assert _estimate_json(cli, *args, "--gpus-per-node", "16")["job"]["gpus_per_node"] == 16
    assert _estimate_json(cli, *args, "--allow-cross-node-tp")["plan"]["tp"] == 16


def test_plan_file_round_trip(cli, tmp_path):
    doc = _estimate_json(cli, *JOB, *PLAN, "--recompute", "selective", "--zero", "1")
    whole, plan_only = tmp_path / "estimate.json", tmp_path / "plan.json"
    whole.write_text(json.dumps(doc))
    plan_only.write_text(json.dumps(doc["plan"]))
    for path in (whole, plan_only):
        again = _estimate_json(cli, *JOB, "--plan", str(path))
        assert again["plan"] == doc["plan"]
        assert again["step_time_s"] == doc["step_time_s"]


def test_a_plan_document_is_recosted_with_the_job_it_was_planned_with(cli, tmp_path):
    """A whole `--json` document records its job: kernels, dtype, gradient reduction are taken from it where the
    command line leaves them at their default (not silently re-costed as Megatron bf16), must agree where given,
    and the model, cluster and batch must be the same."""
    doc = _estimate_json(cli, *JOB, *PLAN, "--kernels", "torchtitan", "--dtype", "fp8", "--grad-reduce", "bf16")
    path = tmp_path / "estimate.json"
    path.write_text(json.dumps(doc))
    again = _estimate_json(cli, *JOB, "--plan", str(path))
    assert (again["step_time_s"], again["job"]) == (doc["step_time_s"], doc["job"])
    assert _estimate_json(cli, *JOB, "--plan", str(path), "--kernels", "torchtitan")["job"] == doc["job"]
    shorter = [a if a != "8192" else "4096" for a in JOB]
    for args, named in (([*JOB, "--kernels", "megatron"], "--kernels"), ([*JOB, "--dtype", "bf16"], "--dtype"),
                        (shorter, "--seq-len 4096")):
        with pytest.raises(SpecError, match=named):
            cli("estimate", *args, "--plan", str(path))
    doc["job"]["dtype"] = 8
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="job.dtype 8"):
        cli("estimate", *JOB, "--plan", str(path))
    moe = ("--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "256", "--seq-len",
           "4096")
    dropless = _estimate_json(cli, *moe, "--tp", "2", "--pp", "2", "--ep", "4")
    path.write_text(json.dumps(dropless))  # its job block leaves the capacity out: dropless routing
    with pytest.raises(SpecError, match="--moe-capacity-factor differs"):
        cli("estimate", *moe, "--plan", str(path), "--moe-capacity-factor", "1.0")


def test_a_plan_document_alone_is_recosted(cli, tmp_path):
    """`estimate --plan plan.json` with no job flags: the document's job block and model give them; a bare plan
    object has none, so the missing flags are named."""
    doc = _estimate_json(cli, *JOB, *PLAN, "--dtype", "fp8")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    again = _estimate_json(cli, "--plan", str(path))
    assert (again["step_time_s"], again["job"], again["model_spec"]) == (doc["step_time_s"], doc["job"],
                                                                        doc["model_spec"])
    assert _estimate_json(cli, "--plan", str(path), "--gpu", "h100-sxm")["step_time_s"] == doc["step_time_s"]
    path.write_text(json.dumps(doc["plan"]))
    with pytest.raises(SpecError, match="estimate needs --model, --gpu, --gpus, --global-batch, --seq-len: "):
        cli("estimate", "--plan", str(path))
    with pytest.raises(SpecError, match=r"estimate needs --gpus \(or --plan FILE"):
        cli("estimate", *JOB[:4], *JOB[6:], *PLAN)
    # a setting or plan the document gives is named as the document's (user-tester: flags the user never gave)
    path.write_text(json.dumps({**doc, "job": {**doc["job"], "dtype": "fp4"}}))
    with pytest.raises(SpecError, match=f"{re.escape(str(path))}: job.dtype 'fp4'"):
        cli("estimate", "--plan", str(path))
    path.write_text(json.dumps({**doc, "plan": {**doc["plan"], "tp": 3, "dp": 1}}))
    with pytest.raises(SpecError, match=f"^{re.escape(str(path))}: "):
        cli("estimate", "--plan", str(path))
    # a plan costed on a hardware file records only its name: the error names the document's key and the fix
    path.write_text(json.dumps({**doc, "job": {**doc["job"], "gpu": "myh100"}}))
    with pytest.raises(SpecError, match="job.gpu 'myh100' is not a catalog GPU .*; give --gpu FILE"):
        cli("estimate", "--plan", str(path))


def test_estimate_pins_an_uneven_split_as_balanced_and_names_megatrons_etp(cli):
    """Uneven --layers-per-stage puts the vocabulary layers where the fewer layers are (balanced), as plan infers;
    an MoE plan with tp > 1 and no --etp says that Megatron's default differs."""
    doc = _estimate_json(cli, "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64",
                         "--seq-len", "8192", "--tp", "2", "--pp", "4", "--layers-per-stage", "7,9,9,7")
    assert (doc["plan"]["vocab"], doc["plan"]["layers_per_stage"]) == ("balanced", [7, 9, 9, 7])
    result = cli("estimate", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "256",
                 "--seq-len", "4096", "--tp", "2", "--pp", "2", "--ep", "4", "--brief")
    assert result.exit_code == 0 and "Megatron's own default is etp = tp = 2" in result.stderr


def test_plan_from_stdin(cli):
    doc = _estimate_json(cli, *JOB, *PLAN)
    result = cli("estimate", *JOB, "--plan", "-", "--json", input=json.dumps(doc["plan"]))
    assert result.exit_code == 0
    assert json.loads(result.stdout)["step_time_s"] == doc["step_time_s"]


def test_real_llama_config_json_loads(cli, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_CONFIG))
    job = ("--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "16", "--seq-len", "4096", "--tp", "2", "--pp", "1")
    from_file = _estimate_json(cli, "--model", str(config), *job)
    from_catalog = _estimate_json(cli, "--model", "llama3-8b", *job)  # the same shape
    assert from_file["step_time_s"] == from_catalog["step_time_s"]
    assert from_file["peak_memory_gib"] == from_catalog["peak_memory_gib"]


# ------------------------------------------------------------------------------------------------ helpers
def test_parse_int_list():
    assert parse_int_list("4,8,16", "--pp") == (4, 8, 16)
    assert parse_int_list("0", "--zero", minimum=0) == (0,)
    for junk in ("4,x", "", "4,,8", "2.5", "0"):
        with pytest.raises(SpecError, match="--pp"):
            parse_int_list(junk, "--pp")


def test_parse_choice_list_and_one():
    assert parse_choice_list("none,full", "--recompute", ("none", "selective", "full")) == ("none", "full")
    with pytest.raises(SpecError, match="sometimes"):
        parse_choice_list("sometimes", "--recompute", ("none", "selective", "full"))
    assert one((8,), "--tp") == 8
    with pytest.raises(SpecError, match="one value"):
        one((4, 8), "--tp")


# ------------------------------------------------------------------------------------------------ errors
def _hardware_file(tmp_path: Path, drop: str | None = None, add: str | None = None) -> str:
    data = json.loads(H100.read_text())
    if drop:
        del data[drop]
    if add:
        data[add] = 1
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    return str(path)


def _config_file(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


def _with(**changes: str) -> list[str]:
    """JOB and PLAN with some options replaced or added."""
    args = dict(zip(JOB[::2], JOB[1::2], strict=True)) | dict(zip(PLAN[::2], PLAN[1::2], strict=True))
    args.update({"--" + k.replace("_", "-"): v for k, v in changes.items()})
    return [item for pair in args.items() for item in pair]


ERROR_CASES = {
    "unknown model": (lambda tmp: _with(model="llama9-1t"), "known models"),
    "unknown gpu": (lambda tmp: _with(gpu="tpu-v9"), "known GPUs"),
    "hf config missing keys": (lambda tmp: _with(model=_config_file(tmp, {"hidden_size": 4096, "vocab_size": 32000})),
                               "num_hidden_layers"),
    "hardware missing key": (lambda tmp: _with(gpu=_hardware_file(tmp, drop="hbm_bandwidth_GBps")),
                             "hbm_bandwidth_GBps"),
    "hardware unknown key": (lambda tmp: _with(gpu=_hardware_file(tmp, add="nvlink_speed")), "nvlink_speed"),
    "global batch 0": (lambda tmp: _with(global_batch="0"), "--global-batch"),
    "tp not dividing heads": (lambda tmp: _with(gpus="48", tp="3", pp="2"), "num_heads"),
    "degrees vs gpus": (lambda tmp: _with(dp="4"), "--gpus is 64"),
    "gpus not divisible": (lambda tmp: _with(gpus="56"), "not divisible"),
    "gpus not whole nodes": (lambda tmp: _with(gpus="60"), "--gpus 60 is 7.5 nodes of 8 GPUs"),
    "batch not divisible": (lambda tmp: _with(mbs="3"), "dp x mbs"),
    "unknown recompute": (lambda tmp: _with(recompute="sometimes"), "sometimes"),
    "junk degree": (lambda tmp: _with(tp="eight"), "--tp"),
    "list in estimate": (lambda tmp: _with(pp="2,4"), "one value"),
    "unknown option": (lambda tmp: [*_with(), "--turbo"], "--turbo"),
    "non-number option": (lambda tmp: _with(gpus="many"), "--gpus"),
    "missing option": (lambda tmp: ["--model", "llama3-70b"], "--gpu"),
    "pins beside --plan": (lambda tmp: _with(plan=str(H100)), "--plan"),
    "bad plan file": (lambda tmp: [*JOB, "--plan", str(H100)], "missing key"),
    "missing plan file": (lambda tmp: [*JOB, "--plan", str(tmp / "nope.json")], "cannot read"),
    "fp8 on a100": (lambda tmp: _with(gpu="a100-80gb", dtype="fp8"), "fp8"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_user_errors_are_one_line_exit_1(autotune_proc, tmp_path, case):
    make_args, fragment = ERROR_CASES[case]
    proc = autotune_proc("estimate", *make_args(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert fragment in lines[0]
    assert proc.stdout == ""


def test_unknown_command_is_exit_1(autotune_proc):
    proc = autotune_proc("optimise")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1


def test_a_plan_priced_with_another_profile_says_so() -> None:
    """estimate --plan of a document planned with --profile FILE, re-costed without it, names the file to give."""
    from autotune.cli.estimate import profile_drift

    doc = {"op_costs": {"source": "prof.json"}}
    assert profile_drift(doc, "prof.json", "plan.json") == []
    assert profile_drift({"op_costs": {"source": "roofline"}}, "roofline", "plan.json") == []
    assert profile_drift(None, "roofline", "") == []
    (line,) = profile_drift(doc, "roofline", "plan.json")
    assert "plan.json was planned with op times from prof.json" in line and "--profile prof.json" in line
