"""A few real megatron-core training steps on CPU (gloo) from an emitted launch script's arguments:
`python megatron_train.py STEPS ARGV.json...` in each of WORLD_SIZE processes (RANK, MASTER_ADDR/PORT set);
the launches are trained one after the other in the same process group (one start-up for all).

ARGV.json holds what the launch script passed to pretrain_gpt.py (recorded by a stand-in torchrun). Each process
parses it with the Megatron argument mirror (megatron_validate.py), so the TransformerConfig is the one those
arguments give, then runs megatron-core itself: `parallel_state.initialize_model_parallel`, a GPTModel per
virtual stage (local layer spec: no Transformer Engine on CPU, so fp32 and no sequence parallelism), and
`get_forward_backward_func()`'s schedule. Process-local CUDA stand-ins: the current device, synchronize, tensors
megatron-core allocates on "cuda", and the CUDA RNG tracker's fork (dropout is 0). Prints `RESULT {json}` on the
last pipeline stage of data-parallel rank 0 and tensor rank 0, one per launch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def _cpu_stand_ins() -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None

    def on_cpu(fn):
        @functools.wraps(fn)
        def wrapped(*a, **k):
            if str(k.get("device", "")).startswith("cuda"):
                k["device"] = "cpu"
            return fn(*a, **k)
        return wrapped

    for name in ("zeros", "ones", "empty", "tensor", "full", "arange"):
        setattr(torch, name, on_cpu(getattr(torch, name)))
    to = torch.Tensor.to

    def tensor_to(self, *a, **k):
        return to(self, *("cpu" if str(x).startswith("cuda") else x for x in a), **k)

    torch.Tensor.to = tensor_to
    torch.Tensor.cuda = lambda self, *a, **k: self

    class Tracker:
        def fork(self, *a, **k):
            return contextlib.nullcontext()

        def add(self, *a, **k):
            pass

    import megatron.core.tensor_parallel as tensor_parallel
    import megatron.core.tensor_parallel.random as random

    tracker = Tracker()
    random.get_cuda_rng_tracker = tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: tracker


def main(steps: int, argv_files: list[str]) -> None:
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    _cpu_stand_ins()
    from megatron.core import parallel_state as ps

    for argv_file in argv_files:
        train(argv_file, steps)
        ps.destroy_model_parallel()
        dist.barrier()
    dist.destroy_process_group()


def train(argv_file: str, steps: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from megatron_validate import validate_args

    world = int(os.environ["WORLD_SIZE"])
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func

    argv = json.loads(Path(argv_file).read_text())
    v = validate_args(argv, world, tokenizer_vocab=int(os.environ["TOKENIZER_VOCAB"]))
    a = v.args
    ps.initialize_model_parallel(tensor_model_parallel_size=a.tensor_model_parallel_size,
                                 pipeline_model_parallel_size=a.pipeline_model_parallel_size,
                                 virtual_pipeline_model_parallel_size=a.virtual_pipeline_model_parallel_size,
                                 context_parallel_size=a.context_parallel_size)
    # the emitted config, in fp32 and with CPU-initialized weights (no Transformer Engine, no bf16 p2p on gloo)
    config = dataclasses.replace(v.config, params_dtype=torch.float32, pipeline_dtype=torch.float32, bf16=False,
                                 use_cpu_initialization=True, gradient_accumulation_fusion=False)
    torch.manual_seed(0)
    chunks = []
    for vp in range(v.vpp):
        chunks.append(GPTModel(
            config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization=a.normalization),
            vocab_size=v.padded_vocab, max_sequence_length=a.seq_length,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=not a.untie_embeddings_and_output_weights,
            position_embedding_type=a.position_embedding_type, rotary_base=a.rotary_base,
            rotary_percent=a.rotary_percent,
            vp_stage=vp if v.vpp > 1 else None))
    layers = [sum(1 for _ in c.decoder.layers) if hasattr(c, "decoder") else 0 for c in chunks]
    params = [p for c in chunks for p in c.parameters()]
    optimizer = torch.optim.AdamW(params, lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), weight_decay=a.weight_decay)
    seq, mbs = a.seq_length, a.micro_batch_size

    def data():
        g = torch.Generator().manual_seed(ps.get_data_parallel_rank())
        while True:
            yield torch.randint(0, v.padded_vocab, (mbs, seq + 1), generator=g)

    def forward_step(iterator, model):
        tokens = next(iterator)
        position_ids = torch.arange(seq).unsqueeze(0).expand(mbs, -1)
        out = model(tokens[:, :-1], position_ids, None, labels=tokens[:, 1:])

        def loss_func(per_token):
            loss = per_token.float().mean()
            return loss, {"lm loss": loss.detach()}
        return out, loss_func

    iterators = [data() for _ in chunks]
    run = get_forward_backward_func()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        out = run(forward_step_func=forward_step, data_iterator=iterators if v.vpp > 1 else iterators[0],
                  model=chunks, num_microbatches=v.num_microbatches, seq_length=seq, micro_batch_size=mbs,
                  forward_only=False)
        for p in params:  # data-parallel gradient average (Megatron's DDP wrapper does this with buckets)
            if p.grad is not None and ps.get_data_parallel_world_size() > 1:
                dist.all_reduce(p.grad, group=ps.get_data_parallel_group())
                p.grad /= ps.get_data_parallel_world_size()
        optimizer.step()
        if out:
            losses.append(sum(float(x["lm loss"]) for x in out) / len(out))
    if ps.is_pipeline_last_stage() and ps.get_data_parallel_rank() == 0 and ps.get_tensor_model_parallel_rank() == 0:
        print("RESULT " + json.dumps({"argv": argv_file, "losses": losses, "layers_last_rank": layers, "vpp": v.vpp,
                                      "microbatches": v.num_microbatches, "schedule": run.__name__}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
