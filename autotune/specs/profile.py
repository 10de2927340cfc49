"""The measured-profile file (`autotune profile` writes it; `--profile FILE` reads it).

Versioned JSON (`"schema": "autotune-profile/1"`), units in the keys. It records where the numbers come from
(date, device, library versions, model, sequence length, dtype), the measured per-operator points, and
optionally fitted alpha-beta parameters of the collectives per link tier with the points they were fitted to.

The loader is strict: every error is one line naming the file, line (a small scanner of the JSON finds where a
key is written; json.loads gives no positions) and field. The writer is deterministic: fixed key order, numbers
to 6 significant digits, one point per line. Ops too large to time are listed (not_timed)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from autotune.errors import SpecError
from autotune.fileio import decode_text, parse_json, read_bounded, write_file
from autotune.specs import _strict
from autotune.specs.limits import MAX_JSON_DEPTH, MAX_PROFILE_BYTES

SCHEMA = "autotune-profile/1"
DEVICE_KINDS = ("cpu", "cuda")
TIERS = ("intra_node", "inter_node")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p")
_REMEASURE = "re-run `autotune profile` to write a fresh file"


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """What was measured on."""
    kind: Literal["cpu", "cuda"]
    name: str
    """torch.cuda.get_device_name(), or the CPU model from /proc/cpuinfo."""
    threads: int
    """CPU threads torch used (torch.get_num_threads()); 1 per process on a GPU."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Libraries:
    """Versions of what did the measuring."""
    torch: str
    python: str
    autotune: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OpPoint:
    """One operator timed at one per-GPU shape (the cost model's Op of that name at tp and mbs)."""

    op: str
    """Op name as costmodel/ops.py names it (e.g. qkv_proj_dgrad, flash_attention_bwd)."""
    tp: int
    """Tensor-parallel degree whose per-GPU shape was timed."""
    mbs: int
    """Micro-batch size in sequences."""
    sp: bool
    """Sequence parallelism (norms and element-wise ops see tokens / tp)."""
    cp: int = 1
    """Context-parallel degree whose per-GPU shape was timed (seq / cp tokens, ring attention's steps); optional
    in the file, 1 when absent (profiles written before `--cp`)."""
    flops: float
    """FLOPs the cost model counts for this op."""
    bytes: float
    """HBM bytes the cost model counts for this op."""
    seconds: float
    """Median of the timed repeats."""
    stdev_seconds: float
    """Standard deviation of the timed repeats."""
    repeats: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CommPoint:
    """One collective timed at one size."""

    collective: str
    """all_reduce, all_gather, reduce_scatter or p2p (one-way send/recv)."""
    bytes: float
    """The size argument of costmodel/comm.py's function for this collective."""
    seconds: float  # median of the timed repeats
    stdev_seconds: float
    repeats: int
    fit_error_pct: float  # (tier fit - measured) / measured, percent


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveFit:
    """Alpha-beta of one collective alone (reported beside the tier's joint fit)."""

    alpha_us: float
    bandwidth_GBps: float
    max_error_pct: float
    """Largest |relative error| of this fit over its own points, percent."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommTier:
    """Fitted latency and bandwidth of one link tier, as costmodel/comm.py uses them (efficiency 1)."""

    backend: str  # torch.distributed's: gloo or nccl
    nproc: int  # processes in the measured group
    alpha_us: float
    """Latency per collective step (comm.py's Link.latency), microseconds."""
    bandwidth_GBps: float
    """Achieved bandwidth (comm.py's Link.bandwidth), GB/s."""
    max_error_pct: float
    """Largest |relative error| of the joint fit over all points, percent."""
    collectives: dict[str, CollectiveFit]
    points: tuple[CommPoint, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A measured profile; `model`, `seq_len` and `dtype` are None in a comm-only profile (no ops)."""

    path: str
    """Where it was loaded from (not written)."""
    created: str
    """UTC date, YYYY-MM-DD."""
    device: Device
    libraries: Libraries
    model: str | None
    seq_len: int | None
    dtype: str | None
    ops: tuple[OpPoint, ...]
    comm: dict[str, CommTier]
    """Measured link tiers (intra_node, inter_node); empty if none."""
    not_timed: tuple[str, ...] = ()  # ops too large for the device's memory, "name tp=N cp=N mbs=N[ sp]"
    attention_backend: str | None = None  # SDPA's kernel the attention ops ran (cudnn, flash); None: not chosen


# --------------------------------------------------------------------------------------------------- reading
def load_profile(path: Path | str) -> Profile:
    """Read and check a profile file; every problem is a one-line SpecError naming file, line and field."""
    path = Path(path)
    where = f"--profile {path}"
    text = decode_text(read_bounded(path, where, MAX_PROFILE_BYTES, fix=_REMEASURE), where)
    data = parse_json(text, where, max_depth=MAX_JSON_DEPTH, syntax=lambda exc: f"{path}:{exc.lineno}: invalid JSON at column {exc.colno} "
                      f"({exc.msg}); the file is corrupt or truncated: {_REMEASURE}")
    return profile_from_dict(data, _Reader(str(path), key_lines(text)))


def profile_from_dict(data: Any, r: _Reader) -> Profile:
    r.keys(data, (), ("schema", "created", "device", "libraries", "model", "seq_len", "dtype", "ops"),
           ("comm", "not_timed", "attention_backend"))
    if data["schema"] != SCHEMA:
        r.fail(("schema",), f"{data['schema']!r} is not a version this autotune reads ({SCHEMA}); {_REMEASURE}")
    created = r.text(data, ("created",))
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", created):
        r.fail(("created",), f"must be a date YYYY-MM-DD, got {created!r}")
    dev = r.obj(data, ("device",), ("kind", "name", "threads"))
    lib = r.obj(data, ("libraries",), ("torch", "python", "autotune"))
    ops = r.seq(data, ("ops",))
    nullable = ("model", "seq_len", "dtype")
    if ops and any(data[k] is None for k in nullable):
        r.fail((next(k for k in nullable if data[k] is None),), "is null but the profile has ops; give it")
    comm, untimed = data.get("comm") or {}, r.seq(data, ("not_timed",)) if "not_timed" in data else []
    r.keys(comm, ("comm",), (), TIERS)
    points = tuple(_op_point(r, p, ("ops", i)) for i, p in enumerate(ops))
    _no_repeated_points(r, points)
    return Profile(
        path=r.file, created=created,
        device=Device(kind=r.choice(dev, ("device", "kind"), DEVICE_KINDS), name=r.text(dev, ("device", "name")),
                      threads=r.int(dev, ("device", "threads"))),
        libraries=Libraries(**{k: r.text(lib, ("libraries", k)) for k in ("torch", "python", "autotune")}),
        model=None if data["model"] is None else r.text(data, ("model",)),
        seq_len=None if data["seq_len"] is None else r.int(data, ("seq_len",)),
        dtype=None if data["dtype"] is None else r.choice(data, ("dtype",), ("bf16", "fp16", "fp32", "fp8")),
        ops=points,
        comm={tier: _tier(r, comm[tier], ("comm", tier)) for tier in TIERS if tier in comm},
        not_timed=tuple(r.text(untimed, ("not_timed", i)) for i in range(len(untimed))),
        attention_backend=r.choice(data, ("attention_backend",), ("cudnn", "flash")) if "attention_backend" in data
        else None)


def _no_repeated_points(r: _Reader, points: tuple[OpPoint, ...]) -> None:
    """One time per (op, tp, mbs, sp, cp): a second one (from merging two profiles by hand) would be silently
    ignored by the lookup, whichever it is."""
    seen: dict[tuple, int] = {}
    for i, p in enumerate(points):
        key = (p.op, p.tp, p.mbs, p.sp, p.cp)
        if key in seen:
            r.fail(("ops", i), f"repeats ops[{seen[key]}] ({p.op} at tp {p.tp}, mbs {p.mbs}, sp "
                   f"{str(p.sp).lower()}, cp {p.cp}); keep one of them")
        seen[key] = i


def _op_point(r: _Reader, p: Any, at: tuple) -> OpPoint:
    r.keys(p, at, ("op", "tp", "mbs", "sp", "flops", "bytes", "seconds", "stdev_seconds", "repeats"), ("cp",))
    return OpPoint(op=r.text(p, at + ("op",)), tp=r.int(p, at + ("tp",)), mbs=r.int(p, at + ("mbs",)),
                   sp=r.bool(p, at + ("sp",)), cp=r.int(p, at + ("cp",)) if "cp" in p else 1,
                   flops=r.nonneg(p, at + ("flops",)), bytes=r.nonneg(p, at + ("bytes",)),
                   seconds=r.positive(p, at + ("seconds",)), stdev_seconds=r.nonneg(p, at + ("stdev_seconds",)),
                   repeats=r.int(p, at + ("repeats",)))


def _tier(r: _Reader, t: Any, at: tuple) -> CommTier:
    r.keys(t, at, ("backend", "nproc", "alpha_us", "bandwidth_GBps", "max_error_pct", "collectives", "points"))
    fits = t["collectives"]
    r.keys(fits, at + ("collectives",), (), COLLECTIVES)
    points = r.seq(t, at + ("points",))
    return CommTier(
        backend=r.text(t, at + ("backend",)), nproc=r.int(t, at + ("nproc",)),
        alpha_us=r.positive(t, at + ("alpha_us",)), bandwidth_GBps=r.positive(t, at + ("bandwidth_GBps",)),
        max_error_pct=r.nonneg(t, at + ("max_error_pct",)),
        collectives={c: _fit(r, fits[c], at + ("collectives", c)) for c in COLLECTIVES if c in fits},
        points=tuple(_comm_point(r, p, at + ("points", i)) for i, p in enumerate(points)))


def _fit(r: _Reader, f: Any, at: tuple) -> CollectiveFit:
    r.keys(f, at, ("alpha_us", "bandwidth_GBps", "max_error_pct"))
    return CollectiveFit(alpha_us=r.positive(f, at + ("alpha_us",)),
                         bandwidth_GBps=r.positive(f, at + ("bandwidth_GBps",)),
                         max_error_pct=r.nonneg(f, at + ("max_error_pct",)))


def _comm_point(r: _Reader, p: Any, at: tuple) -> CommPoint:
    r.keys(p, at, ("collective", "bytes", "seconds", "stdev_seconds", "repeats", "fit_error_pct"))
    return CommPoint(collective=r.choice(p, at + ("collective",), COLLECTIVES), bytes=r.positive(p, at + ("bytes",)),
                     seconds=r.positive(p, at + ("seconds",)), stdev_seconds=r.nonneg(p, at + ("stdev_seconds",)),
                     repeats=r.int(p, at + ("repeats",)), fit_error_pct=r.number(p, at + ("fit_error_pct",)))


class _Reader:
    """Field checks that turn _strict's errors into `file:line: field: problem` using the key positions."""

    def __init__(self, file: str, lines: dict[tuple, int]) -> None:
        self.file, self.lines = file, lines

    def where(self, at: tuple) -> str:
        while at and at not in self.lines:  # a missing key: point at the object that lacks it
            at = at[:-1]
        return f"{self.file}:{self.lines.get(at, 1)}"

    def fail(self, at: tuple, problem: str) -> None:
        raise SpecError(f"{self.where(at)}: {field_name(at)}: {problem}")

    def keys(self, data: Any, at: tuple, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        if not isinstance(data, dict):
            self.fail(at or ("<top>",), f"must be a JSON object, got {type(data).__name__}; {_REMEASURE}")
        missing = [k for k in required if k not in data]
        if missing:
            self.fail(at + (missing[0],), f"missing (add it; required here: {', '.join(required)})")
        unknown = sorted(k for k in data if k not in required + optional)
        if unknown:
            self.fail(at + (unknown[0],), f"unknown key (remove it; allowed here: "
                                          f"{', '.join(required + optional)})")

    def obj(self, data: dict, at: tuple, required: tuple[str, ...]) -> dict:
        self.keys(data[at[-1]], at, required)
        return data[at[-1]]

    def seq(self, data: dict, at: tuple) -> list:
        value = data[at[-1]]
        if not isinstance(value, list):
            self.fail(at, f"must be a JSON list, got {type(value).__name__}")
        return value

    def _check(self, check, data: dict, at: tuple, *args) -> Any:
        try:
            return check(data, at[-1], *args, "")
        except SpecError as exc:  # _strict says ": <key> must be ..., got ..."; keep that part
            problem = str(exc).split(f"{at[-1]} ", 1)[-1]
            self.fail(at, problem)

    def text(self, data: dict, at: tuple) -> str:
        return self._check(_strict.text, data, at)

    def int(self, data: dict, at: tuple) -> int:
        return self._check(_strict.positive_int, data, at)

    def positive(self, data: dict, at: tuple) -> float:
        return self._check(_strict.positive_float, data, at)

    def nonneg(self, data: dict, at: tuple) -> float:
        return self._check(_strict.nonneg_float, data, at)

    def bool(self, data: dict, at: tuple) -> bool:
        return self._check(_strict.boolean, data, at)

    def choice(self, data: dict, at: tuple, options: tuple[str, ...]) -> str:
        return self._check(_strict.choice, data, at, options)

    def number(self, data: dict, at: tuple) -> float:
        value = data[at[-1]]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(at, f"must be a number, got {value!r}")
        return float(value)


def field_name(at: tuple) -> str:
    """('ops', 3, 'seconds') -> 'ops[3].seconds'."""
    out = ""
    for part in at:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


def key_lines(text: str) -> dict[tuple, int]:
    """The 1-based line of every object key and list element of a valid JSON text, by path:
    ('ops', 3, 'seconds') -> line. json.loads validated the text already, so the scan can be lax."""
    lines: dict[tuple, int] = {}
    stack: list[list] = []  # [path, is_object, current key or index, expecting a key]
    line, pos = 1, 0
    for m in _TOKEN.finditer(text):
        line += text.count("\n", pos, m.start())
        pos, tok = m.start(), m.group()
        top = stack[-1] if stack else None
        if top is not None and top[1] and top[3] and tok.startswith('"'):
            top[2], top[3] = json.loads(tok), False
            lines[top[0] + (top[2],)] = line
            continue
        if top is not None and not top[1] and tok not in ",]":
            lines.setdefault(top[0] + (top[2],), line)
        if tok in "{[":
            here = () if top is None else top[0] + (top[2],)
            stack.append([here, tok == "{", 0, tok == "{"])
        elif tok in "}]":
            stack.pop()
        elif tok == "," and top is not None:
            if top[1]:
                top[3] = True
            else:
                top[2] += 1
    return lines


# --------------------------------------------------------------------------------------------------- writing
def _num(x: float) -> float | int:
    """Whole numbers as integers, others to 6 significant digits: the same value always prints the same."""
    if float(x).is_integer() and abs(x) < 2**53:
        return int(x)
    return float(f"{x:.6g}")


def profile_to_dict(p: Profile) -> dict[str, Any]:
    """The file's content in its fixed key order (`path` is where it was read from and is not written)."""
    doc: dict[str, Any] = {
        "schema": SCHEMA, "created": p.created,
        "device": {"kind": p.device.kind, "name": p.device.name, "threads": p.device.threads},
        "libraries": {"torch": p.libraries.torch, "python": p.libraries.python, "autotune": p.libraries.autotune},
        "model": p.model, "seq_len": p.seq_len, "dtype": p.dtype,
        "ops": [_op_dict(o) for o in p.ops],
    }
    if p.comm:
        doc["comm"] = {tier: _tier_dict(p.comm[tier]) for tier in TIERS if tier in p.comm}
    if p.not_timed:
        doc["not_timed"] = list(p.not_timed)
    if p.attention_backend:
        doc["attention_backend"] = p.attention_backend
    return doc


def _op_dict(o: OpPoint) -> dict[str, Any]:
    """One point; `cp` only where it is not 1, so a profile without context parallelism reads as before."""
    cp = {"cp": o.cp} if o.cp != 1 else {}
    return {"op": o.op, "tp": o.tp, **cp, "mbs": o.mbs, "sp": o.sp, "flops": _num(o.flops), "bytes": _num(o.bytes),
            "seconds": _num(o.seconds), "stdev_seconds": _num(o.stdev_seconds), "repeats": o.repeats}


def _tier_dict(t: CommTier) -> dict[str, Any]:
    return {
        "backend": t.backend, "nproc": t.nproc, "alpha_us": _num(t.alpha_us),
        "bandwidth_GBps": _num(t.bandwidth_GBps), "max_error_pct": _num(t.max_error_pct),
        "collectives": {c: {"alpha_us": _num(f.alpha_us), "bandwidth_GBps": _num(f.bandwidth_GBps),
                            "max_error_pct": _num(f.max_error_pct)}
                        for c in COLLECTIVES if (f := t.collectives.get(c)) is not None},
        "points": [{"collective": q.collective, "bytes": _num(q.bytes), "seconds": _num(q.seconds),
                    "stdev_seconds": _num(q.stdev_seconds), "repeats": q.repeats,
                    "fit_error_pct": _num(q.fit_error_pct)} for q in t.points],
    }


def dump_profile(p: Profile) -> str:
    """Deterministic text: two-space indent, each measured point on one line."""
    return _render(profile_to_dict(p), "") + "\n"


def _render(value: Any, indent: str) -> str:
    inner = indent + "  "
    if isinstance(value, dict):
        if not value:
            return "{}"
        body = ",\n".join(f"{inner}{json.dumps(k)}: {_render(v, inner)}" for k, v in value.items())
        return "{\n" + body + "\n" + indent + "}"
    if isinstance(value, list) and value and isinstance(value[0], dict):
        body = ",\n".join(inner + json.dumps(item, separators=(", ", ": ")) for item in value)
        return "[\n" + body + "\n" + indent + "]"
    return json.dumps(value)


def write_profile(p: Profile, path: Path) -> Path:
    """Write the profile atomically (a reader never sees half a file)."""
    return write_file(Path(path), dump_profile(p))
