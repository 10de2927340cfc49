"""What autotune accepts from a user: the name character set and the documented maxima.

Both are checked where input enters (the spec readers, the plan-document reader and the command line), before
anything is sized from it, so that no input can make a command allocate or loop without bound, and no name
can carry code into an emitted launch script or config.

Names. A model name (a catalog name, the `"name"` of a model file, or the `--model` path of a Hugging Face
config.json, which becomes the model's name), a GPU/hardware name (the `"name"` of a hardware file) and the GPU
name inside a plan document are written into emitted files. They must match NAME_PATTERN: 1 to
MAX_NAME_LENGTH characters from NAME_CHARS (ASCII letters, digits and `. _ + - /`), not starting with `-`.
Paths with other characters (spaces, quotes, `$`, newlines) are refused with the fix: rename or copy the file.
The emitters quote what they write anyway (autotune/emit/quote.py); this is the first of two fences.
"""

from __future__ import annotations

import re

from autotune.errors import SpecError

#: The characters a name may hold (documented above): no whitespace, quotes, `$`, backticks, `;`, `#`...
NAME_CHARS = "A-Z a-z 0-9 . _ + - /"
MAX_NAME_LENGTH = 200
NAME_PATTERN = re.compile(r"[A-Za-z0-9._+/][A-Za-z0-9._+/-]{0,%d}" % (MAX_NAME_LENGTH - 1))

#: A GPU architecture name in a hardware file: NVIDIA's compute capability ("9.0") or a vendor's target ("gfx942").
ARCHITECTURE_PATTERN = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}|gfx[0-9a-f]{3,4}")

#: GPUs in a job: about ten times the largest clusters trained on (about 100k GPUs in 2024).
MAX_GPUS = 1 << 20
#: Sequences per optimizer step: 65,536 is the largest published batch (LAMB on BERT-Large, You et al. 2020).
MAX_GLOBAL_BATCH = 1 << 16
#: Tokens per sequence: million-token contexts.
MAX_SEQ_LEN = 1 << 20
#: Tokens to train (`--train-tokens`): about 300 times the largest published pretraining runs (~36T tokens, 2025).
MAX_TRAIN_TOKENS = 1e16
#: Transformer layers: DeepNet trained 1,000 (Wang et al. 2022).
MAX_LAYERS = 1024
#: Pipeline passes `estimate` simulates, micro-batches x pp x vpp (about 10 s for the slowest schedule, v-half).
MAX_PIPELINE_PASSES = 1 << 18
#: Bytes of a JSON input (model, hardware, plan file or document on stdin).
MAX_JSON_BYTES = 16 << 20
#: Levels of nested arrays/objects in a JSON input (autotune's own files nest 4 deep, a Hugging Face config 3).
MAX_JSON_DEPTH = 64
#: Bytes of a profile file (a measured profile of a 70B model is well under 1 MiB).
MAX_PROFILE_BYTES = 16 << 20
#: Tokens of one micro-batch `autotune profile` may time (mbs x seq_len).
MAX_PROFILE_TOKENS = 1 << 20
#: Runs in a `calibrate` runs file (the fit with leave-one-out grows with the square of the runs).
MAX_CALIBRATION_RUNS = 256
#: Bytes of a `calibrate` runs file.
MAX_RUNS_FILE_BYTES = 1 << 20

#: The largest value of each integer field of a model, hardware, plan document or profile file, checked where the
#: file is read (autotune/specs/_strict.py) so that no size reaches the cost model that could overflow it. Each is
#: 10 to 100 times the largest published model (hidden 25,600 and vocabulary 256,000 in 2024); any other integer
#: field (a count of NICs, SMs, repeats, experts) is at most MAX_INT_FIELD.
INT_MAXIMA = {
    "num_layers": MAX_LAYERS,
    "hidden_size": 1 << 18,
    "ffn_hidden_size": 1 << 20,
    "moe_ffn_hidden_size": 1 << 20,
    "shared_expert_ffn_hidden_size": 1 << 20,
    "num_experts": 1 << 16,  # Kimi K2 routes over 384
    "moe_top_k": 1 << 10,
    "num_heads": 1 << 12,
    "num_kv_heads": 1 << 12,
    "head_dim": 1 << 12,
    "vocab_size": 1 << 23,
    "max_position_embeddings": 1 << 24,
    "global_batch": MAX_GLOBAL_BATCH,
    "seq_len": MAX_SEQ_LEN,
    "gpus_per_node": MAX_GPUS,
    "gpus": MAX_GPUS,
}
MAX_INT_FIELD = 1 << 31
#: The largest gradient bucket, in parameters: Megatron-Core's default, 1M x dp, at the largest dp autotune takes
#: (specs/plan.default_bucket); beyond it a bucket is a typo (one holding a whole stage already acts as one)
MAX_BUCKET = 1_000_000 * MAX_GPUS
#: The range of each number of a hardware file (units in the key): from a thousandth of the slowest GPU autotune
#: knows (V100) to about a thousand times the fastest, so a typo is caught and no time or size overflows; any other
#: number (a profile's FLOPs and seconds) is finite and at most MAX_FLOAT_FIELD.
FLOAT_RANGES = {
    "memory_GiB": (1 / 1024, 1 << 16),
    "memory_reserve_GiB": (0.0, 1 << 16),
    "hbm_bandwidth_GBps": (1.0, 1e6),
    "bf16_TFLOPs": (0.01, 1e6),
    "fp16_TFLOPs": (0.01, 1e6),
    "fp8_TFLOPs": (0.0, 1e6),
    "intra_node_GBps": (0.01, 1e6),
    "inter_node_GBps": (0.01, 1e6),
    "intra_node_latency_us": (1e-3, 1e6),
    "inter_node_latency_us": (1e-3, 1e6),
    "kernel_overhead_us": (0.0, 1e6),
}
MAX_FLOAT_FIELD = 1e21


def check_name(value: object, field: str, where: str) -> str:
    """`value` as a name (see the module docstring), or a one-line SpecError naming the field and the fix."""
    if not isinstance(value, str) or NAME_PATTERN.fullmatch(value) is None:
        shown = ascii(value) if not isinstance(value, str) or len(value) <= 60 else ascii(value[:60]) + "..."
        raise SpecError(f"{where}: {field} {shown} is not a valid name: use 1 to {MAX_NAME_LENGTH} "
                        f"characters from {NAME_CHARS} (not starting with -); change the name, or copy the file to "
                        "such a path")
    return value


def int_maximum(field: str) -> int:
    """The documented maximum of an integer field (INT_MAXIMA, else MAX_INT_FIELD)."""
    return INT_MAXIMA.get(field, MAX_INT_FIELD)


def float_range(field: str) -> tuple[float, float]:
    """The documented (minimum, maximum) of a number (FLOAT_RANGES, else (0, MAX_FLOAT_FIELD))."""
    return FLOAT_RANGES.get(field, (0.0, MAX_FLOAT_FIELD))


def check_train_tokens(value: float) -> float:
    """--train-tokens: a number of tokens > 0 and at most MAX_TRAIN_TOKENS (also refuses NaN and infinity)."""
    if not 0 < value <= MAX_TRAIN_TOKENS:
        raise SpecError(f"--train-tokens {value:g}: must be a number of tokens > 0 and <= {MAX_TRAIN_TOKENS:g}, "
                        "e.g. 1e12")
    return value


def check_max(value: int, maximum: int, field: str, where: str = "") -> int:
    """`value` if it is at most `maximum`, else a one-line SpecError giving both."""
    if value > maximum:
        raise SpecError(f"{where + ': ' if where else ''}{field} {value} exceeds the maximum of {maximum:,}; "
                        "use a smaller value")
    return value


#: The largest MoE routing load (busiest expert's tokens over the mean) and capacity factor a job may give
MAX_MOE_FACTOR = 64.0
