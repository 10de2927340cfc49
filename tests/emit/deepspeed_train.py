"""A few real DeepSpeed training steps on CPU (gloo), driven by the emitted ds_config.json and ds_pipeline.json as
they are: `python deepspeed_train.py STEPS DIR...` in each of WORLD_SIZE processes (RANK, MASTER_ADDR/PORT set);
the directories are trained one after the other in the same process group (one start-up for all).

The model is a tiny Llama-like decoder whose layer classes are named like Megatron-DeepSpeed's GPTModelPipe, so
that the emitted partition regex counts the transformer layers only. With pp > 1 it is a PipelineModule built
from ds_pipeline.json (stages, topology, partition method, activation checkpoint interval) and trained with
`train_batch()`; with pp 1 a plain module whose layers go through deepspeed.checkpointing.checkpoint when the
config has an activation_checkpointing section. Prints one `RESULT {json}` line per directory on rank 0.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

VOCAB, HIDDEN, SEQ = 64, 32, 16


class EmbeddingPipe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, tokens):
        return self.embed(tokens)


class ParallelTransformerLayerPipe(nn.Module):
    """Pre-norm MLP block standing in for a transformer layer (its parameters and activations are what matter)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


class LMHeadPipe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.head = nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x):
        return self.head(self.norm(x))


def loss_fn(logits, labels):
    return nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), labels.reshape(-1))


class Plain(nn.Module):
    def __init__(self, layers: int, checkpoint) -> None:
        super().__init__()
        self.embed, self.head = EmbeddingPipe(), LMHeadPipe()
        self.layers = nn.ModuleList(ParallelTransformerLayerPipe() for _ in range(layers))
        self.checkpoint = checkpoint

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = self.checkpoint(layer, x) if self.checkpoint else layer(x)
        return self.head(x)


def batch(mbs: int, step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (mbs, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def main(steps: int, directories: list[str]) -> None:
    import deepspeed
    import deepspeed.ops

    # DeepSpeed JIT-compiles its shared-memory all-reduce (an inference kernel training never calls) before the
    # process group exists: on a fresh machine the ranks queue minutes on the compile lock, past the caller's timeout
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    for directory in directories:
        run(directory, steps)
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run(directory: str, steps: int) -> None:
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from deepspeed.utils import groups

    # an engine before this one left process-global state: a pipeline's grid as the mpu, Ulysses' mesh
    groups.mpu, groups.mesh_device = None, None
    torch.manual_seed(0)
    rank = torch.distributed.get_rank()
    config_path = Path(directory) / "ds_config.json"
    config, pipe = json.loads(config_path.read_text()), json.loads((Path(directory) / "ds_pipeline.json").read_text())
    mbs, gas = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    layers = sum(pipe["layers_per_stage"])
    losses, lrs = [], []
    if pipe["num_stages"] > 1:
        specs = [LayerSpec(EmbeddingPipe), *[LayerSpec(ParallelTransformerLayerPipe) for _ in range(layers)],
                 LayerSpec(LMHeadPipe)]
        model = PipelineModule(layers=specs, num_stages=pipe["num_stages"], loss_fn=loss_fn,
                               topology=PipeModelDataParallelTopology(**pipe["topology"]),
                               partition_method=pipe["partition_method"],
                               activation_checkpoint_interval=pipe["activation_checkpoint_interval"],
                               checkpointable_layers=pipe["checkpointable_layers"])
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=str(config_path))
        dp_rank = engine.grid.get_data_parallel_rank()
        for step in range(steps):
            data = iter([batch(mbs, step * gas + i, dp_rank) for i in range(gas)])
            losses.append(float(engine.train_batch(data_iter=data)))
            lrs.append(engine.get_lr()[0])
        parts = [int(x) for x in model.parts]
    else:
        checkpoint = None
        if "activation_checkpointing" in config:
            deepspeed.checkpointing.configure(None, deepspeed_config=str(config_path))
            checkpoint = deepspeed.checkpointing.checkpoint
        model = Plain(layers, checkpoint)
        # the config as a dict: deepspeed.initialize looks for sequence_parallel_size (Ulysses) only there
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        sp = config.get("sequence_parallel_size", 1)  # mesh (data_parallel, sequence_parallel): rank = d * sp + s
        for step in range(steps):
            total = 0.0
            for i in range(gas):
                tokens, labels = batch(mbs, step * gas + i, rank // sp)
                piece = SEQ // sp  # this rank's slice of the sequence (the stand-in layers mix no tokens)
                tokens, labels = (t[:, rank % sp * piece:(rank % sp + 1) * piece] for t in (tokens, labels))
                loss = loss_fn(engine(tokens), labels)
                engine.backward(loss)
                engine.step()
                total += float(loss) / gas
            losses.append(total)
            lrs.append(engine.get_lr()[0])
        parts = []
    if rank == 0:
        print("RESULT " + json.dumps({"dir": directory,
            "losses": losses, "lrs": lrs, "zero": engine.zero_optimization_stage(), "dp": engine.dp_world_size, "sp": engine.sequence_parallel_size,
            "gas": engine.gradient_accumulation_steps(), "train_batch_size": engine.train_batch_size(),
            "bf16": engine.bfloat16_enabled(), "optimizer": type(engine.optimizer).__name__,
            "basic_optimizer": type(engine.basic_optimizer).__name__ if engine.basic_optimizer else None,
            "scheduler": type(engine.lr_scheduler).__name__, "parts": parts}), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main(int(sys.argv[1]), sys.argv[2:])
