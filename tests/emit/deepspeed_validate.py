"""Check emitted DeepSpeed files with DeepSpeed's own code on CPU (../shared/TRAINERS.md section 3).

* `DeepSpeedConfig(path, mpu=stub)` parses ds_config.json exactly as `deepspeed.initialize` does and runs the
  batch (`_batch_assertion`), ZeRO (pydantic) and precision checks. Without torch.distributed it would silently
  assume a world size of 1, so `dist.get_rank` is stubbed and the mpu stub returns the plan's dp.
* The pipeline engine's own rules, mirrored from runtime/pipe/engine.py (its __init__ needs a process group):
  ZeRO < 2 with pp > 1, and train_batch == micro batch x micro-batches x dp.
* `PipelineModule._partition_layers` itself, run over stand-in layer specs (embedding, transformer layers,
  final norm, LM head) with ds_pipeline.json's partition_method, must give partition_method_layers_per_stage;
  `PipeModelDataParallelTopology(**topology)` must span the world size.

Usable as a script: `python tests/emit/deepspeed_validate.py DIR` prints OK and the derived figures, or
INVALID and DeepSpeed's message (exit 1).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import deepspeed.runtime.config as dsc
from deepspeed.runtime.pipe.module import LayerSpec, PipelineModule
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
from torch import nn

CONFIG_FILE, PIPELINE_FILE = "ds_config.json", "ds_pipeline.json"


class _MPU:
    """The two mpu methods DeepSpeedConfig calls (Megatron-DeepSpeed's mpu has many more)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return 0


@contextlib.contextmanager
def _rank_zero() -> Iterator[None]:
    """Let DeepSpeedConfig ask for a rank without a process group (restored afterwards)."""
    saved = dsc.dist.get_rank
    dsc.dist.get_rank = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        dsc.dist.get_rank = saved


def deepspeed_config(config: dict[str, Any] | str | Path, *, dp: int, pp: int = 1) -> dsc.DeepSpeedConfig:
    """DeepSpeed's parse of a config (dict or file path) for `dp` data-parallel ranks, plus the pipeline
    engine's rules when pp > 1. Raises whatever DeepSpeed raises (AssertionError, pydantic ValidationError)."""
    with _rank_zero(), contextlib.redirect_stdout(io.StringIO()):
        cfg = dsc.DeepSpeedConfig(str(config) if isinstance(config, Path) else config, mpu=_MPU(dp))
    assert cfg.world_size == dp, f"the mpu stub was not used: world size {cfg.world_size}, not dp {dp}"
    if pp > 1:
        # runtime/pipe/engine.py PipelineEngine.__init__
        assert cfg.zero_optimization_stage < 2, "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        assert cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * dp
    return cfg


# Stand-ins named like Megatron-DeepSpeed's GPTModelPipe layers; only their class names matter to the partition.
class EmbeddingPipe(nn.Module): ...
class ParallelTransformerLayerPipe(nn.Module): ...  # noqa: E701
class MixedFusedLayerNorm(nn.Module): ...  # noqa: E701
class LMHeadPipe(nn.Module): ...  # noqa: E701


def deepspeed_partition(method: str, num_layers: int, pp: int) -> list[int]:
    """Transformer layers per stage that `PipelineModule._partition_layers(method)` gives (run unbound on a
    stand-in module, since a real PipelineModule needs a process group of pp ranks)."""
    specs = [LayerSpec(EmbeddingPipe), *[LayerSpec(ParallelTransformerLayerPipe)] * num_layers,
             LayerSpec(MixedFusedLayerNorm), LayerSpec(LMHeadPipe)]
    fake = types.SimpleNamespace(num_stages=pp, _layer_specs=specs, global_rank=0, loss_fn=None,
                                 _topo=PipeModelDataParallelTopology(num_pp=pp, num_mp=1, num_dp=1))
    fake._find_layer_type = lambda name: PipelineModule._find_layer_type(fake, name)
    fake._set_bounds = lambda start, stop: None
    with contextlib.redirect_stdout(io.StringIO()):
        PipelineModule._partition_layers(fake, method=method)
    parts = fake.parts
    return [sum(isinstance(s, LayerSpec) and s.typename is ParallelTransformerLayerPipe
                for s in specs[parts[i]:parts[i + 1]]) for i in range(pp)]


def validate(files: dict[str, str], workdir: Path) -> dict[str, Any]:
    """Write the files to `workdir`, check them with DeepSpeed, return the figures DeepSpeed derived."""
    for name, content in files.items():
        (workdir / name).write_text(content)
    pipe = json.loads(files[PIPELINE_FILE])
    mpu, pp = pipe["mpu"], pipe["num_stages"]
    cfg = deepspeed_config(workdir / CONFIG_FILE, dp=mpu["data_parallel_size"], pp=pp)
    num_layers = sum(pipe["layers_per_stage"])
    got = deepspeed_partition(pipe["partition_method"], num_layers, pp)
    assert got == pipe["partition_method_layers_per_stage"], f"DeepSpeed partitions {got}, file says " \
        f"{pipe['partition_method_layers_per_stage']}"
    topo = PipeModelDataParallelTopology(**pipe["topology"])
    # DeepSpeed's PipelineParallelGrid needs the topology to cover every rank (Ulysses ranks in the dp axis)
    assert topo.world_size() == pipe["world_size"]
    assert topo.get_dim("data") == mpu["data_parallel_size"] * mpu["sequence_parallel_world_size"]
    assert (mpu["tensor_model_parallel_size"], mpu["pipeline_model_parallel_size"]) == \
        (pipe["topology"]["num_mp"], pp)
    if pp > 1:
        assert cfg.pipeline["activation_checkpoint_interval"] == pipe["activation_checkpoint_interval"]
    return {"dp": cfg.world_size, "train_batch_size": cfg.train_batch_size,
            "micro_batch": cfg.train_micro_batch_size_per_gpu, "grad_accum": cfg.gradient_accumulation_steps,
            "zero": int(cfg.zero_optimization_stage), "bf16": cfg.bfloat16_config.enabled,
            "fp16": cfg.float16_config.enabled, "stages": pp, "layers": got,
            "bf16_states": (cfg.bfloat16_config.bf16_optimizer_states
                            and cfg.bfloat16_config.bf16_master_weights_and_grads)}


def main(argv: list[str]) -> int:
    directory = Path(argv[0])
    files = {name: (directory / name).read_text() for name in (CONFIG_FILE, PIPELINE_FILE)}
    try:
        print("OK", validate(files, directory))
    except Exception as exc:  # noqa: BLE001 - a script reporting DeepSpeed's verdict
        print("INVALID", " ".join(str(exc).split()))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
