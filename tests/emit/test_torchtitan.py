"""torchtitan emitter: golden files, torchtitan's own checks on every scenario (0.3.0 in-process on the flags the
launch script really passes, 0.2.2 in one subprocess on the TOML), broken configs rejected, determinism, mapping.

torchtitan 0.2.2 lives outside site-packages (0.3.0 is installed): AUTOTUNE_TT022_PATH, by default
<sys.prefix>/torchtitan-0.2.2, made with `pip install --no-deps --target <that path> torchtitan==0.2.2`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.emit import EmitInput, emit
from autotune.emit.runfiles import launch_shape
from autotune.emit.torchtitan import emit_torchtitan, run_overrides
from autotune.emit.torchtitan_mapping import REGISTRY, module_fqns, stage_ranks, virtual_stage_layers
from autotune.errors import SpecError

from . import torchtitan_validate as tv
from .megatron_validate import RUN_ENV
from .scenarios import GOLDEN, PLANNER_CASES, planner_scenarios

NAMES = [*GOLDEN, *(case[0] for case in PLANNER_CASES)]
TT022 = Path(os.environ.get("AUTOTUNE_TT022_PATH") or Path(sys.prefix) / "torchtitan-0.2.2")


def scenario(name: str) -> EmitInput:
    return GOLDEN[name] if name in GOLDEN else dict(planner_scenarios())[name]


def files(inp: EmitInput, fmt: str = "cli") -> dict[str, str]:
    return dict(emit_torchtitan(inp, fmt=fmt).files)


def shape(inp: EmitInput, fmt: str) -> dict:
    """The model a user's config function / flavor must have (tying only where torchtitan allows it)."""
    m = inp.model
    return {"name": m.name, "n_layers": m.num_layers, "n_heads": m.num_heads, "n_kv_heads": m.num_kv_heads,
            "head_dim": m.head_dim, "vocab_size": m.vocab_size, "ffn": m.ffn_hidden_size,
            "tied": m.tied_embeddings and inp.plan.pp == 1 and fmt == "cli"}


def run_script(script: str, tmp_path: Path, env: dict[str, str] | None = None,
               args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run launch_torchtitan.sh with a fake torchrun that prints its argv (NUL-separated)."""
    (tmp_path / "launch.sh").write_text(script)
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n")
    fake.chmod(0o755)
    full = {"PATH": f"{fake.parent}:{os.environ['PATH']}", **RUN_ENV, **(env or {})}
    return subprocess.run(["bash", str(tmp_path / "launch.sh"), *args], capture_output=True, text=True,
                          env={k: v for k, v in full.items() if v is not None})


def launched_argv(inp: EmitInput, tmp_path: Path, *, register: bool = True) -> list[str]:
    """What torchtitan.train receives from the emitted script; for a model torchtitan lacks, the config function
    the warning asks for is registered in torchtitan_validate (needs torchtitan) or named `user_config`."""
    env = {} if inp.model.name in REGISTRY else {"TT_CONFIG": "user_config"}
    if env and register:
        env = {"TT_MODULE": tv.__name__, "TT_CONFIG": tv.register_config(shape(inp, "cli"))}
    proc = run_script(files(inp)["launch_torchtitan.sh"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    argv = proc.stdout.split("\0")[:-1]
    return argv[argv.index("torchtitan.train") + 1:]


@pytest.fixture(scope="module")
def tt030():
    try:
        version = importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torchtitan 0.3.0 is not installed")
    if not version.startswith("0.3"):
        pytest.skip(f"torchtitan {version} is installed, these checks need 0.3.x")
    return tv


# ---------------------------------------------------------------- files


@pytest.mark.parametrize("fmt", ["cli", "toml"])
@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden(name, fmt, check_golden):
    check_golden(emit_torchtitan(GOLDEN[name], fmt=fmt), "torchtitan", f"{fmt}/{name}")


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_sorted(name):
    inp = scenario(name)
    for fmt in ("cli", "toml"):
        first, second = emit_torchtitan(inp, fmt=fmt), emit_torchtitan(inp, fmt=fmt)
        assert first == second
        assert [n for n, _ in first.files] == sorted(n for n, _ in first.files)
    # the dispatch adds warnings only (e.g. the planned gradient bucket torchtitan's config cannot set)
    dispatched, direct = emit("torchtitan", inp, torchtitan_format="toml"), emit_torchtitan(inp, fmt="toml")
    assert dispatched.files == direct.files and set(direct.warnings) <= set(dispatched.warnings)


@pytest.mark.parametrize("name", list(GOLDEN))
def test_script_passes_exactly_the_overrides(name, tmp_path):
    inp = scenario(name)
    lines = files(inp)["torchtitan_overrides.txt"].splitlines()
    argv = launched_argv(inp, tmp_path, register=False)
    tokens = [token for line in lines for token in line.split()]
    run = [token for line in run_overrides(inp) for token in line.split()]
    assert argv[4:] == tokens[:-1] + run + ["--hf_assets_path", RUN_ENV["TOKENIZER_MODEL"], "--dataloader.dataset_path",
                                            RUN_ENV["DATA_PATH"], "--dump_folder", RUN_ENV["CHECKPOINT_DIR"],
                                            tokens[-1]]
    assert argv[:4][0::2] == ["--module", "--config"]
    proc = run_script(files(inp)["launch_torchtitan.sh"], tmp_path, {"TT_CONFIG": "x"})
    launch = proc.stdout.split("\0")
    nodes, per_node = launch_shape(inp.plan.num_gpus, inp.gpus_per_node)
    assert launch[:4] == ["--nnodes", str(nodes), "--nproc-per-node", str(per_node)]


def test_script_refuses_to_guess_a_config(tmp_path):
    proc = run_script(files(GOLDEN["interleaved"])["launch_torchtitan.sh"], tmp_path)
    assert proc.returncode != 0 and "TT_CONFIG" in proc.stderr and "24 layers" in proc.stderr
    assert "TT_CONFIG:-llama3_8b" in files(GOLDEN["even"])["launch_torchtitan.sh"]


def test_user_flags_go_before_the_subcommand(tmp_path):
    """tyro reads top-level flags only before the activation-checkpoint subcommand; later flags win."""
    proc = run_script(files(GOLDEN["even"])["launch_torchtitan.sh"], tmp_path, args=("--training.steps", "5"))
    argv = proc.stdout.split("\0")[:-1]
    assert argv[-3:] == ["--training.steps", "5", "activation-checkpoint:selective"]


# ---------------------------------------------------------------- torchtitan 0.3.0, in-process


@pytest.mark.parametrize("name", NAMES)
def test_torchtitan_030_accepts(name, tmp_path, tt030):
    inp = scenario(name)
    plan = inp.plan
    report = tt030.validate_cli(launched_argv(inp, tmp_path), plan.num_gpus, virtual_stage_layers(plan))
    assert report["dp_replicate"] * report["dp_shard"] == plan.dp
    assert report["stages"] == virtual_stage_layers(plan)
    if plan.pp > 1:
        assert report["grad_accum"] == 1 and report["n_microbatches"] == plan.num_microbatches
        assert report["schedule"] == {"1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                                      "zb-h1": "Schedule1F1B", "v-half": "ScheduleZBVZeroBubble"}[plan.schedule]
        assert report["ranks"] == stage_ranks(plan)
    else:
        assert report["grad_accum"] == plan.num_microbatches


def test_bf16_adam_moments_are_torchtitans_own_optimizer(tmp_path, tt030):
    """--optimizer-states bf16-moments: torchtitan 0.3.0 parses optimizer.implementation fused_opt_states_bf16 (its
    fused AdamW with bf16 moments beside fp32 parameters); the 0.2.x TOML has none and says so."""
    inp = scenario("even")
    inp = dataclasses.replace(inp, job=dataclasses.replace(inp.job, optimizer_states="bf16-moments"))
    report = tt030.validate_cli(launched_argv(inp, tmp_path), inp.plan.num_gpus, virtual_stage_layers(inp.plan))
    assert report["optimizer_implementation"] == "fused_opt_states_bf16"
    toml = emit_torchtitan(inp, fmt="toml")
    assert "implementation" not in dict(toml.files)["torchtitan.toml"]
    assert any("torchtitan 0.2.x has no bf16 Adam states" in w for w in toml.warnings)
    plain = tt030.validate_cli(launched_argv(scenario("even"), tmp_path), inp.plan.num_gpus)
    assert plain["optimizer_implementation"] == "fused"


def test_fp8_plans_train_float8_linears_through_a_config_function(tmp_path, tt030, monkeypatch):
    """torchtitan 0.3.0's command line has no FP8 flag (tyro refuses --model.converters): an FP8 Llama 3 plan gets
    a config function beside the script that converts the linear layers as llama3_405b does. torchtitan builds it
    (on a CPU, with the SM 8.9 check answered yes): every transformer linear a Float8Linear, the LM head bf16. The
    405B model's own function already converts; the files no longer warn that they fall back to bf16."""
    pytest.importorskip("torchao", reason="torchao is installed by `make trainers` (--no-deps)")
    import torchtitan.components.quantization.float8 as float8

    monkeypatch.setattr(float8, "has_cuda_capability", lambda *_: True)
    inp = scenario("even")
    inp = dataclasses.replace(inp, job=dataclasses.replace(inp.job, dtype="fp8"))
    out = emit_torchtitan(inp)
    assert not any("fp8" in w for w in out.warnings)
    written = dict(out.files)
    for name, text in written.items():
        (tmp_path / name).write_text(text)
    argv = launched_argv(inp, tmp_path)
    assert argv[:4] == ["--module", "autotune_torchtitan_config", "--config", f"{REGISTRY[inp.model.name][0]}_float8"]
    monkeypatch.syspath_prepend(str(tmp_path))
    from torchtitan.config import ConfigManager

    model = ConfigManager().parse_args(argv[:4]).model_spec.model
    from torchtitan.models.common import Linear  # the config class every linear layer's config derives from

    linears = {fqn: type(config).__qualname__ for fqn, config, _, _ in model.traverse(Linear.Config)}
    assert len(linears) == 5 * len(model.layers) + 1  # wqkv, wo, w1, w2, w3 a layer, and the head (reviewer)
    assert {kind for fqn, kind in linears.items() if fqn != "lm_head"} == {"Float8Linear.Config"}
    assert linears["lm_head"] == "Linear.Config"
    big = dataclasses.replace(inp, model=dataclasses.replace(inp.model, catalog_name="llama3-405b"))
    assert "--config \"${TT_CONFIG:-llama3_405b}\"" in dict(emit_torchtitan(big).files)["launch_torchtitan.sh"]


def _swap(argv: list[str], flag: str, *values: str) -> list[str]:
    """argv with `flag` and its values replaced by `flag *values` (dropped when no values are given)."""
    i = j = argv.index(flag)
    while j + 1 < len(argv) and not argv[j + 1].startswith("--") and ":" not in argv[j + 1]:
        j += 1
    return argv[:i] + ([flag, *values] if values else []) + argv[j + 1:]


def _split_by_fqns(argv: list[str], plan, head: str) -> list[str]:
    """The same argv with the partition given as module_fqns_per_model_part for `plan` (virtual-stage order)."""
    for flag in ("--parallelism.module_fqns_per_model_part", "--parallelism.pipeline_parallel_layers_per_stage",
                 "--parallelism.pipeline_parallel_first_stage_less_layers",
                 "--parallelism.pipeline_parallel_last_stage_less_layers"):
        argv = _swap(argv, flag) if flag in argv else argv
    parts = [",".join(p) for p in module_fqns(plan, head)]
    return argv[:-1] + ["--parallelism.module_fqns_per_model_part", *parts, argv[-1]]


BROKEN_030 = {
    "unknown key": ("even", lambda a: ["--parallelism.tensor_paralel_degree", "2", *a], "Unrecognized options"),
    "degrees != WORLD_SIZE": ("even", lambda a: _swap(a, "--parallelism.tensor_parallel_degree", "3"),
                              r"Invalid parallel dims: .* != WORLD_SIZE\(16\)"),
    "1F1B with 2 stages per rank (layers_per_stage)": (
        "interleaved", lambda a: _swap(a, "--parallelism.pipeline_parallel_schedule", "1F1B"),
        "Single stage schedule requires exactly 1 stage per rank"),
    "1F1B with 2 stages per rank (module_fqns)": (
        "even", lambda a: _split_by_fqns(a, dataclasses.replace(GOLDEN["even"].plan, vpp=2), "lm_head"),
        "Single stage schedule requires exactly 1 stage per rank"),
    "Interleaved1F1B with 1 stage per rank": (
        "uneven_vocab", lambda a: _swap(a, "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B"),
        "Multi-stage schedule requires at least 2 stages per rank"),
    "lbs % mbs": ("interleaved", lambda a: _swap(a, "--training.local_batch_size", "15"), "evenly divisible"),
    "unknown schedule": ("even", lambda a: _swap(a, "--parallelism.pipeline_parallel_schedule", "Foo"),
                         "Unknown schedule name 'Foo'"),
    "gbs % (lbs * dp)": ("even", lambda a: _swap(a, "--training.global_batch_size", "65"),
                         r"65 % \(16 \* 4\) != 0"),
    "seq_len % tp (SP)": ("even", lambda a: _swap(a, "--training.seq_len", "8191"), "divisible by 2"),
    "1F1B with fewer microbatches than stages": (
        "uneven_vocab", lambda a: _swap(a, "--training.local_batch_size", "2"),
        r"Number of microbatches \(2\) must be greater than or equal to the number of stages \(4\)"),
    "0.2.x head name": ("uneven_vocab", lambda a: _split_by_fqns(a, GOLDEN["uneven_vocab"].plan, "output"),
                        "lm_head missing"),
}


@pytest.mark.parametrize("case", list(BROKEN_030))
def test_torchtitan_030_rejects(case, tmp_path, tt030):
    name, mutate, message = BROKEN_030[case]
    inp = GOLDEN[name]
    argv = mutate(launched_argv(inp, tmp_path))
    with pytest.raises(tt030.ConfigRejected, match=message):
        tt030.validate_cli(argv, inp.plan.num_gpus)


def test_torchtitan_030_rejects_a_wrong_partition(tmp_path, tt030):
    inp = GOLDEN["uneven_vocab"]
    with pytest.raises(tt030.ConfigRejected, match=r"layers per virtual stage \[7, 9, 9, 7\], expected"):
        tt030.validate_cli(launched_argv(inp, tmp_path), inp.plan.num_gpus, [8, 8, 8, 8])


def test_tied_embeddings_with_pp_need_the_warning(tmp_path, tt030):
    """torchtitan refuses weight tying with PP, so the emitter must say the config function has to untie them."""
    inp = GOLDEN["interleaved"]
    assert any("weight tying" in w for w in emit_torchtitan(inp).warnings)
    argv = launched_argv(inp, tmp_path)
    argv[argv.index("--config") + 1] = tt030.register_config(shape(inp, "cli") | {"tied": True})
    with pytest.raises(tt030.ConfigRejected, match="Weight tying is not supported with Pipeline Parallel"):
        tt030.validate_cli(argv, inp.plan.num_gpus)


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_registry_configs_match_the_catalog(model, tt030):
    from autotune.catalog import load_model
    from torchtitan.models.llama3 import llama3_configs

    m, flavor = load_model(model), REGISTRY[model][1]
    config = llama3_configs[flavor](attn_backend="flex")
    attention = config.first_attention
    assert (len(config.layers), config.dim, attention.n_heads, attention.n_kv_heads, config.vocab_size,
            config.enable_weight_tying) == (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads,
                                            m.vocab_size, m.tied_embeddings)


# ---------------------------------------------------------------- torchtitan 0.2.2, one subprocess


def _toml_case(name: str, inp: EmitInput, toml: str, stages: list[int] | None) -> dict:
    return {"name": name, "toml": toml, "world_size": inp.plan.num_gpus, "shape": shape(inp, "toml"),
            "stages": stages}


BROKEN_022 = {
    "unknown key": ("even", ("tensor_parallel_degree = 2", "tensor_paralel_degree = 2"), "Invalid field names"),
    "degrees != WORLD_SIZE": ("even", ("tensor_parallel_degree = 2", "tensor_parallel_degree = 3"),
                              r"Invalid parallel dims: .* != WORLD_SIZE\(16\)"),
    "1F1B with 2 stages per rank": ("interleaved", ('"Interleaved1F1B"', '"1F1B"'),
                                    "Single stage schedule requires exactly 1 stage per rank"),
    "lbs % mbs": ("interleaved", ("local_batch_size = 16\nglobal_batch_size = 16",
                                  "local_batch_size = 15\nglobal_batch_size = 15"), "must be divisible by microbatch"),
    "unknown schedule": ("even", ('"1F1B"', '"Foo"'), "Unknown schedule name 'Foo'"),
    "DDP with TP/PP": ("even", ("data_parallel_replicate_degree = 1\ndata_parallel_shard_degree = 4",
                                "data_parallel_replicate_degree = 4\ndata_parallel_shard_degree = 1"),
                       "DDP has not supported > 1D parallelism"),
    "0.3.x head name": ("uneven_vocab", ('"norm", "output"', '"norm", "lm_head"'), "output missing"),
    "bad AC option": ("even", ('selective_ac_option = "op"', 'selective_ac_option = "half"'),
                      "Invalid selective AC option"),
}


@pytest.fixture(scope="module")
def tt022() -> dict:
    """Every scenario's TOML and the broken ones, validated by torchtitan 0.2.2 in one subprocess."""
    if not (TT022 / "torchtitan" / "config").is_dir():
        pytest.skip(f"torchtitan 0.2.2 not found at {TT022}: pip install --no-deps --target {TT022} "
                    "torchtitan==0.2.2 (or set AUTOTUNE_TT022_PATH)")
    cases = [_toml_case(n, scenario(n), files(scenario(n), "toml")["torchtitan.toml"],
                        virtual_stage_layers(scenario(n).plan)) for n in NAMES]
    for case, (name, (old, new), _) in BROKEN_022.items():
        toml = files(GOLDEN[name], "toml")["torchtitan.toml"]
        assert old in toml, (case, old)
        cases.append(_toml_case(f"broken: {case}", GOLDEN[name], toml.replace(old, new), None))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TT022), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, tv.__file__], input=json.dumps(cases), capture_output=True, text=True,
                          env=env, cwd=TT022, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert Path(result["torchtitan"]).resolve().is_relative_to(TT022.resolve()), result["torchtitan"]
    return result["cases"]


@pytest.mark.parametrize("name", NAMES)
def test_torchtitan_022_accepts(name, tt022):
    plan, outcome = scenario(name).plan, tt022[name]
    assert outcome["ok"], outcome.get("error")
    report = outcome["report"]
    assert report["dp_replicate"] * report["dp_shard"] == plan.dp
    assert report["stages"] == virtual_stage_layers(plan)
    assert report["grad_accum"] == (1 if plan.pp > 1 else plan.num_microbatches)


@pytest.mark.parametrize("case", list(BROKEN_022))
def test_torchtitan_022_rejects(case, tt022):
    import re

    outcome = tt022[f"broken: {case}"]
    assert not outcome["ok"] and re.search(BROKEN_022[case][2], outcome["error"]), outcome


# ---------------------------------------------------------------- the mapping


def _with(name: str, **changes) -> EmitInput:
    inp = GOLDEN[name]
    return dataclasses.replace(inp, plan=dataclasses.replace(inp.plan, **changes))


def _keys(inp: EmitInput, fmt: str) -> dict[str, str]:
    text = files(inp, fmt)["torchtitan.toml" if fmt == "toml" else "torchtitan_overrides.txt"]
    sep = " = " if fmt == "toml" else " "
    return {k.rsplit(".", 1)[-1]: v.strip('"') for k, v in (ln.split(sep, 1) for ln in text.splitlines()
                                                           if sep in ln and not ln.startswith(("#", "[", " ")))}


@pytest.mark.parametrize("zero, fmt, replicate, shard, reshard, warns", [
    (0, "cli", "4", "1", None, False),       # DDP-style replication
    (0, "toml", "1", "4", "never", True),     # 0.2.x: no DDP with TP/PP
    (1, "cli", "1", "4", "never", False),    # pp 2: the pipeline keeps FSDP2's weights gathered: ZeRO-1
    (1, "toml", "1", "4", "never", False),
])
def test_zero_mapping(zero, fmt, replicate, shard, reshard, warns):
    inp = _with("even", zero=zero)
    keys = _keys(inp, fmt)
    assert (keys["data_parallel_replicate_degree"], keys["data_parallel_shard_degree"]) == (replicate, shard)
    assert keys.get("fsdp_reshard_after_forward") == reshard
    assert any(w.startswith(f"ZeRO-{zero}") for w in emit_torchtitan(inp, fmt=fmt).warnings) == warns


def test_zero1_without_a_pipeline_is_only_approximated():
    """Without a pipeline schedule FSDP2 re-gathers the weights for every micro-batch: ZeRO-2-like, warned."""
    inp = _with("even", zero=1, pp=1, layers_per_stage=(32,), dp=8)
    keys = _keys(inp, "cli")
    assert (keys["data_parallel_shard_degree"], keys["fsdp_reshard_after_forward"]) == ("8", "never")
    assert any(w.startswith("ZeRO-1") for w in emit_torchtitan(inp).warnings)


def test_zero3_is_fsdp_resharding_after_forward():
    inp = _with("even", zero=3, pp=1, layers_per_stage=(32,), dp=8)
    keys = _keys(inp, "cli")
    assert (keys["data_parallel_shard_degree"], keys["fsdp_reshard_after_forward"]) == ("8", "always")
    assert not any("ZeRO" in w for w in emit_torchtitan(inp).warnings)


@pytest.mark.parametrize("layers, r, option", [((7, 9, 9, 7), 2, "3"), ((7, 9, 9, 7), 4, "full"),
                                               ((7, 9, 9, 7), 1, "7")])
def test_partial_full_recompute_is_at_least_as_much(layers, r, option):
    inp = _with("uneven_vocab", layers_per_stage=layers, recompute_layers=r)
    toml = files(inp, "toml")["torchtitan.toml"]
    expected = 'mode = "full"' if option == "full" else f'mode = "selective"\nselective_ac_option = "{option}"'
    assert expected in toml
    assert "activation-checkpoint:full" in files(inp)["torchtitan_overrides.txt"]
    assert any("recompute full" in w for w in emit_torchtitan(inp, fmt="toml").warnings)


def test_without_pp_torchtitan_accumulates_gradients():
    inp = _with("even", pp=1, dp=8, layers_per_stage=(32,), num_microbatches=8)
    keys = _keys(inp, "cli")
    assert (keys["local_batch_size"], keys["global_batch_size"]) == ("1", "64")
    assert "pipeline_parallel_microbatch_size" not in keys
    assert "disable_cuda_graphs" not in files(inp)["torchtitan_overrides.txt"]
    assert "--training.disable_cuda_graphs\n" in files(GOLDEN["even"])["torchtitan_overrides.txt"]


def test_launch_shape():
    assert launch_shape(16, 8) == (2, 8) and launch_shape(4, 8) == (1, 4) and launch_shape(12, 8) == (3, 4)


def test_unknown_format():
    with pytest.raises(SpecError, match="--torchtitan-format 'yaml'"):
        emit_torchtitan(GOLDEN["even"], fmt="yaml")


def test_warns_when_torchtitan_would_refuse_the_sequence_length():
    inp = dataclasses.replace(GOLDEN["even"], job=dataclasses.replace(GOLDEN["even"].job, seq_len=8191))
    assert any("seq_len 8191" in w and "divisible by 2" in w for w in emit_torchtitan(inp).warnings)
    assert not any("seq_len" in w for w in emit_torchtitan(GOLDEN["even"]).warnings)


# ---------------------------------------------------------------- zero-bubble and V schedules, vocabulary parallelism


def test_v_half_is_zbv_in_v_order():
    """v-half: ZBVZeroBubble, 2 stages per rank; virtual stage s < pp is rank s's first half, s >= pp rank
    2pp-1-s's second half; the embedding in stage 0, norm and head in stage 2pp-1 (both on rank 0)."""
    plan = GOLDEN["v_half"].plan  # layers 6,8,8,10
    assert virtual_stage_layers(plan) == [3, 4, 4, 5, 5, 4, 4, 3]
    assert stage_ranks(plan) == [0, 1, 2, 3, 3, 2, 1, 0]
    parts = module_fqns(plan, "lm_head")
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    for fmt in ("cli", "toml"):
        keys = _keys(GOLDEN["v_half"], fmt)
        assert keys["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    (warning,) = [w for w in emit_torchtitan(GOLDEN["v_half"]).warnings if w.startswith("schedule")]
    assert warning.startswith("schedule v-half: torchtitan has no V-Half; emitted ZBVZeroBubble")
    assert "about twice V-Half's" in warning


def test_v_half_even_split_uses_layers_per_stage(tmp_path, tt030):
    inp = _with("v_half", layers_per_stage=(8, 8, 8, 8))
    keys = _keys(inp, "cli")
    assert keys["pipeline_parallel_layers_per_stage"] == "4" and "module_fqns_per_model_part" not in keys
    report = tt030.validate_cli(launched_argv(inp, tmp_path), 8, [4] * 8)
    assert report["schedule"] == "ScheduleZBVZeroBubble" and report["ranks"] == [0, 1, 2, 3, 3, 2, 1, 0]


def test_zbv_rejects_the_looped_order_and_one_stage_per_rank(tmp_path, tt030):
    inp = GOLDEN["v_half"]
    argv = launched_argv(inp, tmp_path)
    one_stage = _split_by_fqns(argv, dataclasses.replace(inp.plan, schedule="1f1b", vpp=1), "lm_head")
    with pytest.raises(tt030.ConfigRejected, match="at least 2 stages per rank"):
        tt030.validate_cli(one_stage, 8)
    looped = _split_by_fqns(argv, dataclasses.replace(inp.plan, schedule="interleaved"), "lm_head")
    with pytest.raises(tt030.ConfigRejected, match=r"layers per virtual stage \[3, 4, 4, 5, 3, 4, 4, 5\]"):
        tt030.validate_cli(looped, 8, virtual_stage_layers(inp.plan))


def test_zb_h1_is_1f1b_with_a_warning(tmp_path, tt030):
    inp = _with("v_half", schedule="zb-h1", vpp=1)
    assert _keys(inp, "cli")["pipeline_parallel_schedule"] == "1F1B"
    (warning,) = [w for w in emit_torchtitan(inp).warnings if w.startswith("schedule")]
    assert "no single-stage zero-bubble schedule" in warning and "emitted 1F1B" in warning
    report = tt030.validate_cli(launched_argv(inp, tmp_path), 8, [6, 8, 8, 10])
    assert report["schedule"] == "Schedule1F1B" and report["ranks"] == [0, 1, 2, 3]


def test_vocab_parallel_keeps_the_ends():
    inp = GOLDEN["vocab_parallel"]
    assert any(w.startswith("vocab parallel: torchtitan cannot split") for w in emit_torchtitan(inp).warnings)
    assert _keys(inp, "cli")["pipeline_parallel_schedule"] == "1F1B"


def test_the_toml_sets_the_peak_lr_the_other_trainers_set():
    """torchtitan 0.2.x's [optimizer] (name, lr, weight_decay: its JobConfig fields) carries the run's peak LR and
    weight decay, as Megatron's --lr and --weight-decay do; 0.3.0's config functions set their own optimizer."""
    import tomllib

    from .scenarios import GOLDEN

    inp = GOLDEN["even"]
    toml = tomllib.loads(dict(emit("torchtitan", inp, torchtitan_format="toml").files)["torchtitan.toml"])
    argv = dict(emit("megatron", inp).files)["launch_megatron.sh"]
    assert toml["optimizer"] == {"name": "AdamW", "lr": 3e-4, "weight_decay": 0.1}
    assert "--lr 0.0003" in argv and "--weight-decay 0.1" in argv


def test_the_memory_warning_judges_what_the_toml_runs_as_the_header_does():
    """torchtitan's 0.2.x TOML runs sequence parallelism whenever tp > 1 (toml_runs): the header re-estimates that
    plan, and the out-of-memory warning must judge the same one (it judged the plan without the TOML's changes,
    through a copy of the header's as-run logic)."""
    asked = []

    def reestimate(plan, job, model=None):
        asked.append(plan)
        return 3.0, (80.0 if plan.sequence_parallel else 40.0), 0.3

    inp = dataclasses.replace(GOLDEN["interleaved"], reestimate=reestimate, usable_memory_gib=60.0,
                              peak_memory_gib=40.0)
    assert inp.plan.tp == 2 and not inp.plan.sequence_parallel
    toml = emit("torchtitan", inp, torchtitan_format="toml")
    header = dict(toml.files)["torchtitan.toml"]
    assert "peak memory 80.0 GiB per GPU" in header and "(re-estimated for what torchtitan runs)" in header
    assert any(w.startswith("the config as torchtitan runs it is predicted to need 80.0 GiB per GPU, over the "
                            "60.0 GiB usable") for w in toml.warnings)
    assert asked and all(p.sequence_parallel for p in asked)
    cli = emit("torchtitan", inp, torchtitan_format="cli")  # the 0.3.0 CLI runs the plan as planned: it fits
    assert not any("run out of memory" in w for w in cli.warnings)


@pytest.mark.parametrize("fmt", ["cli", "toml"])
def test_blocks_and_positions_llama3_cannot_build_are_named(fmt):
    """torchtitan's llama3 rotates whole heads with RoPE and runs attention then MLP: a GPT-NeoX-style model (RoPE
    on a quarter of each head, attention beside the MLP) or an ALiBi one needs a model of its own, and the warning
    says which of these it has."""
    base = GOLDEN["even"]
    neox = dataclasses.replace(base, model=dataclasses.replace(base.model, name="neox-like", rotary_fraction=0.25,
                                                               parallel_block=True))
    alibi = dataclasses.replace(base, model=dataclasses.replace(base.model, name="bloom-like",
                                                                position_embedding="alibi"))
    said = [w for w in emit_torchtitan(neox, fmt=fmt).warnings if "needs a model of its own" in w]
    assert len(said) == 1 and "attention beside the MLP (a parallel block)" in said[0]
    assert "RoPE on 25% of each head" in said[0]
    assert any("alibi positions" in w for w in emit_torchtitan(alibi, fmt=fmt).warnings)
    assert not any("needs a model of its own" in w for w in emit_torchtitan(base, fmt=fmt).warnings)
