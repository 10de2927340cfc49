"""Real torchtitan 0.3.0 training steps on CPU (gloo), driven by the emitted launch_torchtitan.sh unchanged.

Three roles, one file (it lives in tests/emit, which the test puts on PYTHONPATH):
* `python torchtitan_train.py torchrun ARGS...`: the stand-in `torchrun` the test puts first on PATH. It reads
  the script's --nnodes/--nproc-per-node/--rdzv-endpoint, checks `-m torchtitan.train`, and starts one worker per
  process with RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, as torchrun would on one node.
* `python torchtitan_train.py worker ARGS...`: installs the CPU shim below, then runs `torchtitan.train` as
  `__main__` with the script's arguments (its own config parsing, Trainer, parallelize, pipeline, loop).
* `--module torchtitan_train --config tiny_llama` (TT_MODULE/TT_CONFIG, the emitted script's own variables): the
  config function for the tiny model (AUTOTUNE_TT_SHAPE, JSON) on llama3_debugmodel's recipe, reading a local text
  corpus (the dataset "autotune_tiny", one document a line at --dataloader.dataset_path).

The CPU shim (only what CPU/gloo and torch 2.13.0 lack; the trainer's own code runs otherwise):
* device type "cpu" instead of torchtitan's fallback "cuda" (torch._utils._get_available_device_type), and
  torch.cpu stand-ins for the few torch.cuda-style calls (set_device, memory stats, empty_cache);
* FSDP2's sum-reduction path (`force_sum_reduction_for_comms`, what it does for MTIA): torchtitan sets a gradient
  divide factor of 1 (the loss is already divided by the global token count), which FSDP2 turns into
  ReduceOp.PREMUL_SUM, which gloo lacks; SUM with a post-division by 1 computes the same;
* FlexAttention -> SDPA with the same block-causal document mask made dense: torch 2.13.0 has no FlexAttention
  backward on CPU (and torchtitan compiles its forward with inductor), so the model computes what it would on GPU
  with another kernel; torch's create_block_mask runs eager for the same reason;
* torch 2.13.0 lacks two APIs torchtitan 0.3.0 calls: `torch.distributed.set_timeout` (after step 1; a no-op
  here: gloo's default timeout stays) and the pipeline `schedule.step(arg_mbs=, kwarg_mbs=, target_mbs=)`
  form (mapped onto torch 2.13's `_step_microbatches`, which takes the same per-micro-batch lists).
The config function, not the shim, picks `parallelism.spmd_backend = "partial_dtensor"` (see tiny_llama); the
emitted launch sets no backend, so on GPUs torchtitan's default runs.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>")


# ---------------------------------------------------------------- local data and tokenizer (no downloads)


def write_corpus(path: Path, lines: int = 400) -> None:
    """A deterministic text corpus: short sentences over a 40-word vocabulary, one document a line."""
    words = ("the cat dog sat ran on a mat red blue big small fast slow and or not to of in it is was "
             "he she we they see saw run jump up down left right one two three four five six").split()
    docs = [" ".join(words[(7 * i + 3 * j + j * j) % len(words)] for j in range(5 + i % 11)) for i in range(lines)]
    path.write_text("\n".join(docs) + "\n")


def build_tokenizer(corpus: Path, out: Path, vocab_size: int) -> int:
    """A word-level Hugging Face tokenizer trained on the corpus (tokenizer.json + tokenizer_config.json, what
    torchtitan's HuggingFaceTokenizer loads from hf_assets_path); returns its vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train([str(corpus)], trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=["<unk>", *SPECIALS]))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": SPECIALS[0], "eos_token": SPECIALS[1]}))
    return tok.get_vocab_size()


# ---------------------------------------------------------------- the config function (TT_CONFIG=tiny_llama)


def _register_dataset() -> None:
    from datasets import Dataset
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    def load(path: str):
        return Dataset.from_dict({"text": Path(path).read_text().splitlines()})

    DATASETS["autotune_tiny"] = DatasetConfig(path="", loader=load, sample_processor=lambda s: s["text"])


def tiny_llama():
    """llama3_debugmodel's trainer settings with the tiny Llama of AUTOTUNE_TT_SHAPE and the local corpus."""
    import dataclasses

    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers, model_registry
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    shape = json.loads(os.environ["AUTOTUNE_TT_SHAPE"])
    dim, vocab = shape["n_heads"] * shape["head_dim"], shape["vocab_size"]
    model = Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=False,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim), lm_head=Linear.Config(in_features=dim, out_features=vocab),
        layers=_build_llama3_layers(n_layers=shape["n_layers"], dim=dim, n_heads=shape["n_heads"],
                                    n_kv_heads=shape["n_kv_heads"], hidden_dim=shape["ffn"], attn_backend="flex",
                                    rope=ComplexRoPE.Config(dim=shape["head_dim"], max_seq_len=256,
                                                            theta=shape["rope_theta"], scaling="none")))
    config = llama3_debugmodel()
    config.model_spec = dataclasses.replace(model_registry("debugmodel"), flavor="tiny", model=model,
                                            state_dict_adapter=None)
    config.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab))
    config.dataloader.dataset = "autotune_tiny"
    config.validator.enable = False
    # torchtitan 0.3.0's default "spmd_types" hands fully_shard plain tensors with dp_mesh_dims, which torch
    # 2.13.0's FSDP2 rejects ("all parameters must be DTensors on the full SPMD mesh"); "partial_dtensor" is
    # its DTensor-for-TP, FSDP2-on-the-dp-mesh path, which torch 2.13.0 runs
    config.parallelism.spmd_backend = "partial_dtensor"
    return config


# ---------------------------------------------------------------- the CPU shim


def _cpu_shim() -> None:
    import torch
    import torch._utils

    torch._utils._get_available_device_type = lambda: "cpu"
    torch.cpu.current_device = lambda: 0  # an index, as torch.cuda's (barrier(device_ids=[...]))
    for name, value in (("set_device", lambda *a, **k: None), ("empty_cache", lambda: None),
                        ("reset_peak_memory_stats", lambda *a, **k: None), ("memory_stats", lambda *a, **k: {}),
                        ("get_device_name", lambda *a, **k: "cpu"),
                        ("get_device_properties", lambda *a, **k: SimpleNamespace(total_memory=1 << 34))):
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, value)

    import torch.distributed as dist

    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = lambda timeout, group=None: None

    from torch.distributed.pipelining import schedules

    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        if "arg_mbs" not in inspect.signature(cls.step).parameters:
            cls.step = _pre_split_step(cls.step)

    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    divide_factors = _fsdp_collectives._get_gradient_divide_factors

    def sum_reduction(*args, **kwargs):
        bound = inspect.signature(divide_factors).bind(*args, **kwargs)
        bound.arguments["force_sum_reduction_for_comms"] = True
        return divide_factors(*bound.args, **bound.kwargs)

    _fsdp_collectives._get_gradient_divide_factors = sum_reduction

    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.common import attention

    attention.FlexAttention._compiled_flex_attn = staticmethod(_flex_as_sdpa)
    attention._compiled_create_block_mask = create_block_mask


def _flex_as_sdpa(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux, kernel_options):
    """flex_attention's result through SDPA with the block mask made dense (the same block-causal document
    mask): torch 2.13 has no FlexAttention backward on CPU, and its compiled forward needs inductor."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_mask

    # context parallelism (torch's flex CP) all-gathers K/V in a forward pre-hook and shards the block mask, whose
    # mask_mod then maps local query rows to global positions, so the dense mask is still the right one
    assert score_mod is None and not return_aux.lse, "score_mod and the log-sum-exp output are not shimmed"
    mask = create_mask(block_mask.mask_mod, q.shape[0], None, q.shape[2], k.shape[2], device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa), None


def _pre_split_step(whole_batch_step):
    """torchtitan 0.3.0's `step(arg_mbs=, kwarg_mbs=, target_mbs=)` (inputs already split into micro-batches)
    on torch 2.13.0, whose step() only splits a whole batch: what step() does around `_step_microbatches`."""

    def step(self, *args, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None, return_outputs=True,
             loss_kwargs=None, **kwargs):
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            return whole_batch_step(self, *args, losses=losses, return_outputs=return_outputs,
                                    loss_kwargs=loss_kwargs, **kwargs)
        stages = getattr(self, "_stages", None) or [self._stage]
        for stage in stages:
            stage.has_backward = self._has_backward
            stage.clear_runtime_states()
        self._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs=loss_kwargs)
        last = [stage for stage in stages if stage.is_last]
        return self._merge_outputs(last[0].output_chunks) if last and return_outputs else None

    return step


def worker(argv: list[str]) -> None:
    import runpy

    _cpu_shim()
    _register_dataset()
    sys.argv = ["torchtitan.train", *argv]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


# ---------------------------------------------------------------- the stand-in torchrun


def torchrun(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="torchrun")
    for name in ("--nnodes", "--nproc-per-node", "--node-rank"):
        p.add_argument(name, type=int, required=True)
    p.add_argument("--rdzv-backend", required=True)
    p.add_argument("--rdzv-endpoint", required=True)
    p.add_argument("-m", dest="module", required=True)
    known, rest = p.parse_known_args(argv)
    if known.module != "torchtitan.train" or known.nnodes != 1 or known.node_rank != 0:
        print(f"stand-in torchrun: expected one node running -m torchtitan.train, got {argv}", file=sys.stderr)
        return 2
    host, port = known.rdzv_endpoint.rsplit(":", 1)
    world = known.nproc_per_node
    log = os.environ.get("AUTOTUNE_TT_LAUNCH_LOG")
    if log:
        Path(log).write_text(json.dumps({"nnodes": known.nnodes, "nproc_per_node": world, "argv": rest}))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1" if host == "localhost" else host, "MASTER_PORT": port,
           "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, __file__, "worker", *rest],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(world)]
    # like torchrun: when one worker fails, stop the others (they would wait in a collective until the timeout)
    while any(proc.poll() is None for proc in procs):
        if any(proc.poll() not in (None, 0) for proc in procs):
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        time.sleep(0.2)
    return max((proc.returncode for proc in procs), key=abs)


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "torchrun":
        sys.exit(torchrun(args))
    worker(args)
