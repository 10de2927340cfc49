"""torchtitan launch files of mixture-of-experts plans (issue 14): torchtitan's own MoE models (qwen3 30B-A3B and
235B-A22B, deepseek_v3 671B, gpt_oss 120b) with expert_parallel_degree, checked by torchtitan's own code on CPU:
0.3.0 in-process (the flags the launch script passes: config parser, ParallelDims, the pipeline split, and the
device meshes built on a fake process group, where the expert-parallel region dp_shard x cp x tp must split into
efsdp x ep), 0.2.2 in a subprocess (the TOML with expert_parallel_degree / expert_tensor_parallel_degree).
Models torchtitan lacks (Mixtral) and DeepSpeed MoE are refused in one line saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.catalog import load_model
from autotune.emit import EmitInput, emit
from autotune.emit.torchtitan import CONFIG_MODULE
from autotune.emit.torchtitan_mapping import MOE_REGISTRY, virtual_stage_layers
from autotune.errors import SpecError
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan, check_plan
from autotune.specs.trainers import TORCHTITAN_MOE_MODELS, TRAINER_CAPS, expert_layout_issue, unsupported

from . import torchtitan_validate as tv
from .test_torchtitan import TT022, run_script

JOB = JobSpec(global_batch=256, seq_len=4096, trainer="torchtitan")

#: name: (model, plan, what the emitter must warn about, the expert TP the 0.2.x TOML keeps)
CASES = {
    "qwen3_30b_fsdp_ep8": ("qwen3-30b-a3b", Plan(tp=1, pp=1, dp=16, ep=8, mbs=1, num_microbatches=16, zero=3,
                                                 recompute="full", layers_per_stage=(48,)), None),
    "qwen3_30b_tp_no_ep": ("qwen3-30b-a3b", Plan(tp=2, pp=1, dp=4, ep=1, etp=2, mbs=2, num_microbatches=32, zero=3,
                                                 sequence_parallel=True, layers_per_stage=(48,)), None),
    "qwen3_30b_etp_tp": ("qwen3-30b-a3b", Plan(tp=2, pp=1, dp=8, ep=4, etp=2, mbs=1, num_microbatches=32, zero=3,
                                               sequence_parallel=True, layers_per_stage=(48,)),
                         "no expert tensor parallelism with ep > 1"),
    "qwen3_235b_pipelined": ("qwen3-235b-a22b", Plan(tp=2, pp=2, dp=16, ep=8, mbs=1, num_microbatches=16, zero=1,
                                                     sequence_parallel=True, recompute="full",
                                                     layers_per_stage=(47, 47)), None),
    "deepseek_v3_uneven": ("deepseek-v3", Plan(tp=2, pp=4, dp=16, ep=32, mbs=1, num_microbatches=16, zero=1,
                                               sequence_parallel=True, recompute="full", vocab="balanced",
                                               layers_per_stage=(14, 16, 16, 15)), None),
    "gpt_oss_ddp_ep": ("gpt-oss-120b", Plan(tp=1, pp=1, dp=8, ep=8, mbs=1, num_microbatches=32, zero=0,
                                            recompute="full", layers_per_stage=(36,)),
                       "ZeRO-0 with ep 8: torchtitan takes expert-parallel ranks from dp_shard x cp x tp"),
}


def _inp(model: str, plan: Plan) -> EmitInput:
    m = load_model(model)
    check_plan(plan, m, JOB, plan.num_gpus, 8)
    return EmitInput(plan=plan, model=m, job=JOB, gpu="h100-sxm", gpus_per_node=8, step_time_s=2.5,
                     peak_memory_gib=40.0, mfu=0.4, mock_data=True)


def _files(inp: EmitInput, fmt: str = "cli") -> dict[str, str]:
    return dict(emit("torchtitan", inp, torchtitan_format=fmt).files)


def _argv(inp: EmitInput, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What torchtitan.train receives from the emitted script; a config module written beside it is importable."""
    files = _files(inp)
    if f"{CONFIG_MODULE}.py" in files:
        (tmp_path / f"{CONFIG_MODULE}.py").write_text(files[f"{CONFIG_MODULE}.py"])
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, CONFIG_MODULE, raising=False)
    proc = run_script(files["launch_torchtitan.sh"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    argv = proc.stdout.split("\0")[:-1]
    return argv[argv.index("torchtitan.train") + 1:]


@contextlib.contextmanager
def _fake_world(size: int):
    """A process group of `size` ranks that communicates nothing (torch's fake backend): DeviceMesh needs one."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def expert_meshes(argv: list[str], world_size: int) -> dict[str, int]:
    """torchtitan 0.3.0 builds its meshes (ParallelDims.build_mesh): the sparse mesh unflattens
    dp_shard x cp x tp into efsdp x ep, and fails where ep does not divide it."""
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims

    with tv._rejections():
        cfg = ConfigManager().parse_args(list(argv))
        dims = ParallelDims.from_config(cfg.parallelism, world_size)
        with _fake_world(world_size):
            dims.build_mesh()
            efsdp = dims.get_optional_mesh("efsdp")
            return {"ep": dims.ep, "efsdp": efsdp.size() if efsdp is not None else 0}


def _experts(model_config) -> list:
    """The MoE config of every MoE layer of a torchtitan 0.3.0 model config."""
    return [layer.moe for layer in model_config.layers if layer.moe is not None]


@pytest.fixture(scope="module")
def tt030():
    pytest.importorskip("torchtitan.config")
    import importlib.metadata

    if not importlib.metadata.version("torchtitan").startswith("0.3"):
        pytest.skip("these checks need torchtitan 0.3.x")
    return tv


# ---------------------------------------------------------------- what is emitted


@pytest.mark.parametrize("case", sorted(CASES))
def test_expert_keys_and_warnings(case: str) -> None:
    model, plan, warns = CASES[case]
    inp = _inp(model, plan)
    result = emit("torchtitan", inp)
    overrides = dict(result.files)["torchtitan_overrides.txt"].splitlines()
    ep_emitted = plan.ep
    assert f"--parallelism.expert_parallel_degree {ep_emitted}" in overrides
    assert not any("expert_tensor" in line for line in overrides)  # 0.3.0 has no such key
    assert "--compile.components model,loss" in overrides
    text = "\n".join(result.warnings)
    assert (warns in text) if warns else not any("etp" in w or "ep " in w for w in result.warnings), text
    # torchtitan trains no MTP module: DeepSeek-V3's is left out, and the warning says so
    assert ("multi-token prediction module(s) are not trained by torchtitan" in text) == bool(
        load_model(model).mtp_layers)
    toml = _files(inp, "toml")["torchtitan.toml"]
    etp = plan.etp if plan.ep > 1 else 1
    assert f"expert_parallel_degree = {plan.ep}\nexpert_tensor_parallel_degree = {etp}\n" in toml
    t = MOE_REGISTRY[model]
    assert f'[model]\nname = "{t.module}"\nflavor = "{t.flavor}"\n' in toml


def test_the_capability_row_names_the_emitted_models() -> None:
    assert sorted(TORCHTITAN_MOE_MODELS) == sorted(MOE_REGISTRY)
    caps = TRAINER_CAPS["torchtitan"]
    assert caps.moe and caps.moe_models == TORCHTITAN_MOE_MODELS
    assert expert_layout_issue(caps, tp=2, cp=1, zero=3, ep=4, etp=2) is not None  # no expert TP with ep > 1
    assert expert_layout_issue(caps, tp=2, cp=1, zero=3, ep=1, etp=1) is not None  # ep 1: experts follow tp
    assert expert_layout_issue(caps, tp=2, cp=1, zero=3, ep=8, etp=1) is None
    assert expert_layout_issue(caps, tp=1, cp=1, zero=0, ep=8, etp=1) is not None  # replicas are not EP ranks
    assert expert_layout_issue(TRAINER_CAPS["megatron"], tp=2, cp=1, zero=0, ep=4, etp=2) is None
    _, plan, _ = CASES["qwen3_30b_etp_tp"]
    assert any("etp 2 with ep 4" in line for line in unsupported(caps, plan, load_model("qwen3-30b-a3b"), JOB))
    assert not unsupported(caps, CASES["qwen3_30b_fsdp_ep8"][1], load_model("qwen3-30b-a3b"), JOB)
    mixtral = unsupported(caps, Plan(tp=1, pp=1, dp=8, ep=8, mbs=1, num_microbatches=32, zero=3,
                                     layers_per_stage=(32,)), load_model("mixtral-8x7b"), JOB)
    assert any("has no such model" in line for line in mixtral)


# ---------------------------------------------------------------- refusals


MIXTRAL = Plan(tp=1, pp=1, dp=8, ep=8, mbs=1, num_microbatches=32, zero=3, layers_per_stage=(32,))


def test_torchtitan_refuses_an_moe_model_it_lacks() -> None:
    inp = _inp("mixtral-8x7b", MIXTRAL)
    for fmt in ("cli", "toml"):
        with pytest.raises(SpecError, match=r"torchtitan 0.3.0 has no model for the mixture of experts "
                                            r"mixtral-8x7b .*use --trainer megatron") as err:
            emit("torchtitan", inp, torchtitan_format=fmt)
        assert "\n" not in str(err.value)


def test_deepspeed_refuses_moe_and_says_why() -> None:
    inp = _inp("qwen3-30b-a3b", CASES["qwen3_30b_fsdp_ep8"][1])
    with pytest.raises(SpecError, match=r"deepspeed.moe.layer.MoE\(ep_size=...\) in model code.*use --trainer "
                                        "megatron") as err:
        emit("deepspeed", inp)
    assert "\n" not in str(err.value)


def test_colossalai_still_refuses_moe() -> None:
    with pytest.raises(SpecError, match="use --trainer megatron"):
        emit("colossalai", _inp("qwen3-30b-a3b", CASES["qwen3_30b_fsdp_ep8"][1]))


# ---------------------------------------------------------------- torchtitan 0.3.0, in-process


@pytest.mark.parametrize("case", sorted(CASES))
def test_torchtitan_030_accepts(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tt030) -> None:
    model, plan, _ = CASES[case]
    inp = _inp(model, plan)
    argv = _argv(inp, tmp_path, monkeypatch)
    report = tt030.validate_cli(argv, plan.num_gpus, virtual_stage_layers(plan))
    assert report["dp_replicate"] * report["dp_shard"] == plan.dp
    assert report["stages"] == virtual_stage_layers(plan)
    meshes = expert_meshes(argv, plan.num_gpus)
    region = report["dp_shard"] * plan.cp * plan.tp
    assert meshes == {"ep": plan.ep, "efsdp": region // plan.ep if plan.ep > 1 else 0}


def test_torchtitan_030_rejects_an_ep_that_does_not_split_the_region(tmp_path: Path, monkeypatch, tt030) -> None:
    """The mesh check is torchtitan's own: ep 6 does not divide dp_shard x cp x tp = 16."""
    _, plan, _ = CASES["qwen3_30b_fsdp_ep8"]
    argv = _argv(_inp("qwen3-30b-a3b", plan), tmp_path, monkeypatch)
    i = argv.index("--parallelism.expert_parallel_degree")
    argv[i + 1] = "6"
    with pytest.raises(tt030.ConfigRejected, match="unflatten"):
        expert_meshes(argv, plan.num_gpus)


@pytest.mark.parametrize("model", sorted(MOE_REGISTRY))
def test_registry_moe_models_match_the_catalog(model: str, tt030) -> None:
    import importlib

    m, t = load_model(model), MOE_REGISTRY[model]
    config = importlib.import_module(f"torchtitan.models.{t.module}").model_registry(t.flavor).model
    moes = _experts(config)
    first = moes[0]
    inner = first.routed_experts.inner_experts
    attention = config.layers[0].attention
    assert (len(config.layers), config.dim, attention.n_heads, config.vocab_size, config.enable_weight_tying) == (
        m.num_layers, m.hidden_size, m.num_heads, m.vocab_size, m.tied_embeddings)
    assert (inner.num_experts, first.router.top_k, inner.hidden_dim, len(moes)) == (
        m.num_experts, m.moe_top_k, m.moe_ffn_hidden_size, m.num_moe_layers)
    assert first.router.score_func == m.router
    assert (first.shared_experts is not None) == (m.num_shared_experts > 0)
    if not m.mla:
        assert attention.n_kv_heads == m.num_kv_heads
    else:
        assert (attention.q_lora_rank, attention.kv_lora_rank) == (m.q_lora_rank, m.kv_lora_rank)


def test_own_config_function_keeps_the_recipe_vocabulary(tmp_path: Path, monkeypatch, tt030) -> None:
    """Qwen3-235B-A22B has no torchtitan config function: ours reuses qwen3_30b_a3b's recipe, whose loss is sized
    for the same vocabulary."""
    _, plan, _ = CASES["qwen3_235b_pipelined"]
    argv = _argv(_inp("qwen3-235b-a22b", plan), tmp_path, monkeypatch)
    from torchtitan.config import ConfigManager

    cfg = ConfigManager().parse_args(argv)
    assert cfg.model_spec.flavor == "235B-A22B"
    assert cfg.loss.loss_fn.global_vocab_size == load_model("qwen3-235b-a22b").vocab_size


# ---------------------------------------------------------------- torchtitan 0.2.2 (TOML), one subprocess

VALIDATE_022 = r'''
import json, sys, tempfile
from pathlib import Path
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import torchtitan
from torchtitan.config import ConfigManager
from torchtitan.distributed import ParallelDims
from torchtitan.protocols.train_spec import get_train_spec

out = {}
for case in json.load(sys.stdin):
    path = Path(tempfile.mkdtemp()) / "x.toml"
    path.write_text(case["toml"])
    try:
        cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
        par = cfg.parallelism
        dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                            cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                            pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                            etp=par.expert_tensor_parallel_degree, world_size=case["world_size"])
        dist.init_process_group("fake", rank=0, world_size=case["world_size"], store=FakeStore())
        try:
            dims.build_mesh()
        finally:
            dist.destroy_process_group()
        args = get_train_spec(cfg.model.name).model_args[cfg.model.flavor]
        args.update_from_config(cfg)
        out[case["name"]] = {"ok": True, "report": {
            "ep": dims.ep, "etp": dims.etp, "dp": dims.dp_replicate * dims.dp_shard, "n_layers": args.n_layers,
            "num_experts": args.moe_args.num_experts, "top_k": args.moe_args.top_k, "moe_dim": args.moe_inter_dim}}
    except (Exception, SystemExit) as exc:
        out[case["name"]] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
print("RESULT " + json.dumps({"torchtitan": torchtitan.__file__, "cases": out}))
'''


@pytest.fixture(scope="module")
def tt022() -> dict:
    if not (TT022 / "torchtitan" / "config").is_dir():
        pytest.skip(f"torchtitan 0.2.2 not found at {TT022}")
    cases = []
    for name, (model, plan, _) in CASES.items():
        toml = _files(_inp(model, plan), "toml")["torchtitan.toml"]
        cases.append({"name": name, "toml": toml, "world_size": plan.num_gpus})
        if name == "qwen3_30b_etp_tp":  # 0.2.2 allows etp 1 or tp only
            cases.append({"name": "broken: etp 4", "world_size": plan.num_gpus,
                          "toml": toml.replace("expert_tensor_parallel_degree = 2", "expert_tensor_parallel_degree = 4")})
        if name == "qwen3_30b_fsdp_ep8":
            cases.append({"name": "broken: ep 6", "world_size": plan.num_gpus,
                          "toml": toml.replace("expert_parallel_degree = 8", "expert_parallel_degree = 6")})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TT022), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", VALIDATE_022], input=json.dumps(cases), capture_output=True,
                          text=True, env=env, cwd=TT022, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert Path(result["torchtitan"]).resolve().is_relative_to(TT022.resolve()), result["torchtitan"]
    return result["cases"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_torchtitan_022_accepts(case: str, tt022: dict) -> None:
    model, plan, _ = CASES[case]
    outcome = tt022[case]
    assert outcome["ok"], outcome.get("error")
    m, report = load_model(model), outcome["report"]
    assert (report["ep"], report["etp"], report["dp"]) == (plan.ep, plan.etp if plan.ep > 1 else 1, plan.dp)
    assert (report["n_layers"], report["num_experts"], report["top_k"], report["moe_dim"]) == (
        m.num_layers, m.num_experts, m.moe_top_k, m.moe_ffn_hidden_size)


@pytest.mark.parametrize(("case", "error"), [("broken: etp 4", "ETP=TP or ETP=1"), ("broken: ep 6", "unflatten")])
def test_torchtitan_022_rejects(case: str, error: str, tt022: dict) -> None:
    outcome = tt022[case]
    assert not outcome["ok"] and error in outcome["error"], outcome


# ---------------------------------------------------------------- the search, restricted to torchtitan


def test_searched_torchtitan_plan_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tt030) -> None:
    """`plan --trainer torchtitan` for an MoE model: only expert layouts torchtitan builds, and the emitted
    launch passes torchtitan's own checks with no warning about the experts."""
    from autotune.catalog import load_hardware
    from autotune.search.planner import search
    from autotune.search.space import SearchSpace

    model, caps = load_model("qwen3-30b-a3b"), TRAINER_CAPS["torchtitan"]
    res = search(model, load_hardware("h100-sxm"), JOB, 16, SearchSpace(trainer=caps), top_k=0, time_limit_s=60)
    plan = res.best.plan
    assert res.status == "OPTIMAL" and unsupported(caps, plan, model, JOB) == []
    result = emit("torchtitan", _inp("qwen3-30b-a3b", plan))
    assert not any("ep " in w or "etp" in w for w in result.warnings), result.warnings
    argv = _argv(_inp("qwen3-30b-a3b", plan), tmp_path, monkeypatch)
    tt030.validate_cli(argv, plan.num_gpus, virtual_stage_layers(plan))
    assert expert_meshes(argv, plan.num_gpus)["ep"] == plan.ep


def test_search_refuses_a_moe_model_torchtitan_lacks() -> None:
    from autotune.search.pins import check_space
    from autotune.search.space import SearchSpace

    with pytest.raises(SpecError, match="--trainer torchtitan: it has no model mixtral-8x7b"):
        check_space(SearchSpace(trainer=TRAINER_CAPS["torchtitan"]), load_model("mixtral-8x7b"), JOB, 8, 8)
    with pytest.raises(SpecError, match="deepspeed.moe.layer.MoE"):
        check_space(SearchSpace(trainer=TRAINER_CAPS["deepspeed"]), load_model("qwen3-30b-a3b"), JOB, 8, 8)
