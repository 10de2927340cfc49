"""Check emitted torchtitan configs with torchtitan's own code, on CPU, without GPUs or a process group.

* torchtitan 0.3.0 (installed): `validate_cli(argv, world_size, shape, stages)` runs in-process on the overrides.
* torchtitan 0.2.2 (a second copy, never installed into site-packages): `python torchtitan_validate.py` with that
  copy first on PYTHONPATH reads a JSON list of cases on stdin and prints one `RESULT {...}` line.

Both replay what the trainer does before its first step, minus what needs devices:
1. `ConfigManager().parse_args` (tyro flags or the TOML file: unknown keys, Trainer.Config.__post_init__ rules);
2. `ParallelDims` with WORLD_SIZE (the degrees must multiply to it);
3. the trainer's own checks: gbs % (lbs x dp_replicate x dp_shard) == 0 and seq_len % the SP/CP divisor
   (trainer.py ~L300-433 in 0.3.0, train.py / parallelize.py in 0.2.2);
4. the model config's `update_from_config` (0.3.0: no weight tying with PP, tp divides the heads, RoPE length);
5. `pipeline_llm` for every pp rank on a meta-device model with `PipelineStage` replaced by a recorder: this
   runs torchtitan's stage-count rules, FQN generation, module split, rank -> stage mapping and builds the real
   torch schedule object (its microbatch rules). The recorded chunks are compared with the expected partition,
   and the pp rank that built each virtual stage is reported (loop or V placement, e.g. ZBVZeroBubble's V).
   torchtitan checks "single-stage schedule = 1 stage per rank, multi-stage >= 2" only for
   pipeline_parallel_layers_per_stage; with module_fqns_per_model_part the same rule is applied here.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


class ConfigRejected(Exception):
    """torchtitan (or a rule it applies at start-up) rejected the config; the message says why."""


# ---------------------------------------------------------------- shared by both versions


class _Group:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size


class _Mesh:
    """The pp DeviceMesh as pipeline_llm uses it (local rank, size, group)."""

    def __init__(self, rank: int, size: int) -> None:
        self._group = _Group(rank, size)

    def get_local_rank(self) -> int:
        return self._group.rank

    def size(self) -> int:
        return self._group.size

    def get_group(self, name: str = "pp") -> _Group:
        return self._group


class _Dims:
    """What pipeline_llm reads from ParallelDims: the pp degree and the pp mesh."""

    def __init__(self, rank: int, pp: int) -> None:
        self.pp, self._mesh = pp, _Mesh(rank, pp)

    def get_mesh(self, dims: Any) -> _Mesh:
        return self._mesh


class _Stage:
    """Stands in for torch's PipelineStage: records the chunk and offers what the schedules read."""

    built: list[_Stage] = []

    def __init__(self, submod: Any, stage_index: int, num_stages: int, device: Any, group: _Group,
                 **_: Any) -> None:
        self.submod, self.stage_index, self.num_stages = submod, stage_index, num_stages
        self.group_size, self.group_rank = group.size, group.rank
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        _Stage.built.append(self)


def _run_pipeline(pp_module: Any, pp: int, call: Any) -> tuple[list[_Stage], Any]:
    """Call pipeline_llm once per pp rank with PipelineStage patched; (all stages by index, last schedule)."""
    saved, pp_module.PipelineStage = pp_module.PipelineStage, _Stage
    _Stage.built = []
    try:
        for rank in range(pp):
            schedule, _, _, _ = call(_Dims(rank, pp))
    finally:
        pp_module.PipelineStage = saved
    stages: dict[int, _Stage] = {}
    for stage in _Stage.built:
        if stage.stage_index in stages:
            raise ConfigRejected(f"virtual stage {stage.stage_index} is built on two pp ranks")
        stages[stage.stage_index] = stage
    return [stages[i] for i in sorted(stages)], schedule


def _check_stage_rule(schedule_name: str, num_stages: int, pp: int) -> None:
    """_get_pipeline_metadata's rule, applied to an explicit module_fqns_per_model_part."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    single = issubclass(get_schedule_class(schedule_name), PipelineScheduleSingle)
    if num_stages % pp:
        raise ConfigRejected(f"Number of virtual stages ({num_stages}) must be divisible by pp ({pp})")
    per_rank = num_stages // pp
    if single and per_rank != 1:
        raise ConfigRejected(f"Single stage schedule requires exactly 1 stage per rank, but got {per_rank}")
    if not single and per_rank < 2:
        raise ConfigRejected(f"Multi-stage schedule requires at least 2 stages per rank, but got {per_rank}")


def _check_chunks(stages: list[_Stage], head: str, num_layers: int, expect: list[int] | None) -> list[int]:
    """Every layer once, in order; the embedding on the first chunk, norm and head on the last."""
    counts, nxt = [], 0
    for v, stage in enumerate(stages):
        if stage.stage_index != v:
            raise ConfigRejected(f"virtual stages are {[s.stage_index for s in stages]}, not 0..{len(stages) - 1}")
        chunk = stage.submod
        ids = [int(k) for k in chunk.layers.keys()]
        if ids != list(range(nxt, nxt + len(ids))):
            raise ConfigRejected(f"virtual stage {v} holds layers {ids}; expected consecutive from {nxt}")
        nxt += len(ids)
        counts.append(len(ids))
        for name, want in (("tok_embeddings", v == 0), ("norm", v == len(stages) - 1), (head, v == len(stages) - 1)):
            if (getattr(chunk, name) is not None) != want:
                raise ConfigRejected(f"virtual stage {v}: {name} {'missing' if want else 'misplaced'}")
    if nxt != num_layers:
        raise ConfigRejected(f"the stages hold {nxt} of the model's {num_layers} layers")
    if expect is not None and counts != expect:
        raise ConfigRejected(f"layers per virtual stage {counts}, expected {expect}")
    return counts


def _batch_rules(training: Any, dp: int, seq_divisor: int) -> int:
    gbs = training.global_batch_size if training.global_batch_size > 0 else training.local_batch_size * dp
    if gbs % (training.local_batch_size * dp):
        raise ConfigRejected(f"global batch size must be multiple of local batch size times data-parallel degree "
                             f"({gbs} % ({training.local_batch_size} * {dp}) != 0)")
    if training.seq_len % seq_divisor:
        raise ConfigRejected(f"Training sequence length ({training.seq_len}) must be divisible by {seq_divisor}")
    return gbs // (training.local_batch_size * dp)


@contextlib.contextmanager
def _rejections():
    """Turn torchtitan's and tyro's failures (exceptions, asserts, SystemExit with a usage box) into ConfigRejected."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            yield
    except ConfigRejected:
        raise
    except SystemExit as exc:
        text = " ".join(err.getvalue().translate({ord(c): " " for c in "│╭╮╰╯─"}).split())  # tyro's box
        raise ConfigRejected(text or f"exit {exc.code}") from None
    except (ValueError, AssertionError, NotImplementedError, KeyError, ImportError) as exc:
        raise ConfigRejected(f"{type(exc).__name__}: {exc}") from None


# ---------------------------------------------------------------- torchtitan 0.3.0 (command-line overrides)

CONFIG_FUNCTION = "autotune_model"


def register_config(shape: dict[str, Any]) -> str:
    """Define `autotune_model` in this module: llama3_8b's trainer settings with a model of the given shape
    (meta-device sized; tying kept only where torchtitan allows it, as the emitter's warning instructs)."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers, parallelize_llama
    from torchtitan.models.llama3.config_registry import llama3_8b
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.protocols.model_spec import ModelSpec

    heads, dim, vocab = shape["n_heads"], shape["n_heads"] * shape["head_dim"], shape["vocab_size"]
    model = Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=shape["tied"],
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim), lm_head=Linear.Config(in_features=dim, out_features=vocab),
        layers=_build_llama3_layers(n_layers=shape["n_layers"], dim=dim, n_heads=heads, n_kv_heads=shape["n_kv_heads"],
                                    hidden_dim=shape["ffn"], attn_backend="flex",
                                    rope=ComplexRoPE.Config(dim=shape["head_dim"], max_seq_len=131072, theta=500000,
                                                            scaling="llama")))

    def autotune_model():
        config = llama3_8b()
        config.model_spec = ModelSpec(name="llama3", flavor=shape["name"], model=model,
                                      parallelize_fn=parallelize_llama, pipelining_fn=pipeline_llm,
                                      post_optimizer_build_fn=None, state_dict_adapter=None)
        return config

    globals()[CONFIG_FUNCTION] = autotune_model
    return CONFIG_FUNCTION


def validate_cli(argv: list[str], world_size: int, expect: list[int] | None = None) -> dict[str, Any]:
    """Everything torchtitan 0.3.0 checks before training, for `--module M --config C <overrides>`."""
    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims, full_dtensor
    from torchtitan.distributed import pipeline_parallel as pp_module

    with _rejections():
        cfg = ConfigManager().parse_args(list(argv))
        par = cfg.parallelism
        dims = ParallelDims.from_config(par, world_size)
        divisor = (dims.tp if par.enable_sequence_parallel else 1) * (2 * dims.cp if dims.cp > 1 else 1)
        grad_accum = _batch_rules(cfg.training, dims.dp_replicate * dims.dp_shard, divisor)
        model_config = cfg.model_spec.model
        model_config.update_from_config(config=cfg)
        report = {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "grad_accum": grad_accum,
                  "optimizer_implementation": cfg.optimizer.implementation,
                  "ac": "none" if cfg.activation_checkpoint is None else
                  type(cfg.activation_checkpoint).__qualname__.split(".")[0]}
        with torch.device("meta"):
            model = model_config.build()
        if par.spmd_backend in ("full_dtensor", "spmd_types"):  # what parallelize_llama checks first
            full_dtensor.validate_config(dims, model)
        if dims.pp == 1:
            return report | {"stages": [len(model_config.layers)]}
        if par.module_fqns_per_model_part is not None:
            _check_stage_rule(par.pipeline_parallel_schedule, len(par.module_fqns_per_model_part), dims.pp)

        def call(fake: _Dims):
            return pp_module.pipeline_llm(
                model, parallel_dims=fake, training=cfg.training, parallelism=par, compile_config=cfg.compile,
                ac_config=None, dump_folder="", device=torch.device("meta"), model_config=model_config,
                parallelize_fn=lambda m, **_: m, loss_fn=lambda *a, **k: (None, None))

        stages, schedule = _run_pipeline(pp_module, dims.pp, call)
        counts = _check_chunks(stages, "lm_head", len(model_config.layers), expect)
    return report | {"schedule": type(schedule).__name__, "n_microbatches": schedule._n_microbatches,
                     "stages": counts, "ranks": [stage.group_rank for stage in stages]}


# ---------------------------------------------------------------- torchtitan 0.2.2 (TOML), run in a subprocess


def validate_toml(path: str, world_size: int, shape: dict[str, Any], expect: list[int] | None) -> dict[str, Any]:
    """Everything torchtitan 0.2.2 checks before training, for `--job.config_file path`."""
    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import pipeline_parallel as pp_module
    from torchtitan.protocols.train_spec import get_train_spec

    with _rejections():
        cfg = ConfigManager().parse_args(["--job.config_file", path])
        par = cfg.parallelism
        dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                            cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                            pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                            etp=par.expert_tensor_parallel_degree, world_size=world_size)
        grad_accum = _batch_rules(cfg.training, dims.dp_replicate * dims.dp_shard, dims.seq_len_divisor)
        if dims.dp_replicate > 1 and not dims.fsdp_enabled and dims.world_size != dims.dp_replicate:
            raise ConfigRejected("DDP has not supported > 1D parallelism (models/llama3/infra/parallelize.py)")
        option = cfg.activation_checkpoint.selective_ac_option
        if cfg.activation_checkpoint.mode == "selective" and not (option == "op" or option.isdigit()):
            raise ConfigRejected(f"Invalid selective AC option: {option}")
        spec = get_train_spec(cfg.model.name)
        if cfg.model.flavor not in spec.model_args:  # a flavor the user adds, as the emitter's comment says
            args_cls = type(next(iter(spec.model_args.values())))
            spec.model_args[cfg.model.flavor] = args_cls(
                dim=shape["n_heads"] * shape["head_dim"], n_layers=shape["n_layers"], n_heads=shape["n_heads"],
                n_kv_heads=shape["n_kv_heads"], vocab_size=shape["vocab_size"])
        model_args = spec.model_args[cfg.model.flavor]
        got = (model_args.n_layers, model_args.n_heads, model_args.n_kv_heads or model_args.n_heads)
        if got != (shape["n_layers"], shape["n_heads"], shape["n_kv_heads"]):
            raise ConfigRejected(f"flavor {cfg.model.flavor} has (layers, heads, kv heads) {got}, the plan's model "
                                 f"{(shape['n_layers'], shape['n_heads'], shape['n_kv_heads'])}")
        model_args.update_from_config(cfg)
        report = {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "grad_accum": grad_accum,
                  "ac": cfg.activation_checkpoint.mode, "ac_option": option}
        if dims.pp == 1:
            return report | {"stages": [model_args.n_layers]}
        if par.module_fqns_per_model_part is not None:
            _check_stage_rule(par.pipeline_parallel_schedule, len(par.module_fqns_per_model_part), dims.pp)
        with torch.device("meta"):
            model = spec.model_cls(model_args)

        def call(fake: _Dims):
            return pp_module.pipeline_llm(model, fake, cfg, torch.device("meta"), model_args,
                                          lambda m, *a, **k: m, lambda *a, **k: None)

        stages, schedule = _run_pipeline(pp_module, dims.pp, call)
        counts = _check_chunks(stages, "output", model_args.n_layers, expect)
    return report | {"schedule": type(schedule).__name__, "n_microbatches": schedule._n_microbatches,
                     "stages": counts, "ranks": [stage.group_rank for stage in stages]}


def main() -> None:
    """stdin: [{name, toml, world_size, shape, stages}]; stdout: `RESULT {name: {ok, error | report}}`."""
    import torchtitan

    cases, out = json.load(sys.stdin), {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            path = Path(tmp) / f"{len(out)}.toml"
            path.write_text(case["toml"])
            try:
                out[case["name"]] = {"ok": True, "report": validate_toml(str(path), case["world_size"],
                                                                         case["shape"], case["stages"])}
            except ConfigRejected as exc:
                out[case["name"]] = {"ok": False, "error": str(exc)}
    print("RESULT " + json.dumps({"torchtitan": torchtitan.__file__, "cases": out}))


if __name__ == "__main__":
    main()
