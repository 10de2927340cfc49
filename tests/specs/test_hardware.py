"""Hardware specs: strict keys, units converted once at the boundary, every figure sourced."""

from __future__ import annotations

import copy

import pytest

from autotune.catalog import hardware_names, load_hardware, load_raw
from autotune.errors import SpecError
from autotune.specs.hardware import hardware_from_dict

RAW = load_raw("hardware", "a100-80gb")


def _raw(**changes):
    data = copy.deepcopy(RAW)
    data.update(changes)
    return data


def test_units_are_converted_to_si():
    """NVIDIA A100 datasheet: 80 GB, 2039 GB/s, 312 TFLOP/s; 600 GB/s NVLink both ways = 300 GB/s one way;
    200 Gb/s HDR = 25 GB/s per GPU."""
    hw = hardware_from_dict(_raw(), "a100.json")
    assert hw.memory_bytes == 80 * 2**30
    assert hw.usable_memory_bytes == 76 * 2**30
    assert hw.hbm_bandwidth == 2039e9
    assert hw.peak_flops("bf16") == hw.peak_flops("fp16") == 312e12
    assert hw.intra_node_bandwidth == 300e9 and hw.inter_node_bandwidth == 25e9
    assert hw.intra_node_latency == pytest.approx(3e-6) and hw.inter_node_latency == pytest.approx(15e-6)


def test_unknown_keys_are_rejected_and_named():
    with pytest.raises(SpecError, match=r"unknown key\(s\) nvlink_GBps"):
        hardware_from_dict(_raw(nvlink_GBps=600), "a100.json")


def test_missing_keys_are_rejected_and_named():
    data = _raw()
    del data["hbm_bandwidth_GBps"]
    with pytest.raises(SpecError, match=r"a100.json: missing key\(s\) hbm_bandwidth_GBps"):
        hardware_from_dict(data, "a100.json")


def test_efficiency_block_is_strict_too():
    data = _raw()
    data["efficiency"] = {**data["efficiency"], "softmax": 0.5}
    with pytest.raises(SpecError, match=r"efficiency: unknown key\(s\) softmax"):
        hardware_from_dict(data, "a100.json")
    data["efficiency"] = {**RAW["efficiency"], "gemm": 1.2}
    with pytest.raises(SpecError, match=r"gemm must be in \(0, 1\]"):
        hardware_from_dict(data, "a100.json")


def test_sources_are_optional_but_checked_when_present():
    """Issue 16: a hand-written hardware file without a sources block loads; a block that is there names
    figures of the file, each with text."""
    data = _raw()
    del data["sources"]
    assert hardware_from_dict(data, "a100.json") == hardware_from_dict(_raw(), "a100.json")
    data = _raw()
    data["sources"] = {k: v for k, v in RAW["sources"].items() if k != "inter_node_GBps"}
    hardware_from_dict(data, "a100.json")  # a figure may go without a source
    data["sources"]["inter_node_gbps"] = "datasheet"
    with pytest.raises(SpecError, match="sources names inter_node_gbps, not a figure of this file"):
        hardware_from_dict(data, "a100.json")
    data["sources"] = {"memory_GiB": ""}
    with pytest.raises(SpecError, match="sources.memory_GiB must be text"):
        hardware_from_dict(data, "a100.json")


def test_reserve_must_be_below_capacity():
    with pytest.raises(SpecError, match="memory_reserve_GiB 80.0 must be below memory_GiB 80"):
        hardware_from_dict(_raw(memory_reserve_GiB=80), "a100.json")


def test_a_gpu_without_fp8_says_so():
    with pytest.raises(SpecError, match="a100-80gb has no fp8 tensor cores; use bf16"):
        load_hardware("a100-80gb").peak_flops("fp8")


def test_the_catalog_holds_the_gpus_the_cli_promises():
    """../shared/CLI.md: at least v100-32gb, a100-40gb, a100-80gb, h100-sxm, h200, b200, mi300x."""
    names = set(hardware_names())
    assert {"v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "mi300x"} <= names
    for name in names:
        hw = load_hardware(name)
        assert 0 < hw.usable_memory_bytes < hw.memory_bytes


def test_every_catalog_gpu_names_its_architecture():
    """NVIDIA's CUDA GPU list: V100 7.0, A100 8.0, H100/H200 9.0, B200 10.0; AMD's ROCm list: MI300X gfx942."""
    want = {"v100-32gb": "7.0", "a100-40gb": "8.0", "a100-80gb": "8.0", "h100-sxm": "9.0", "h100-hbm2e-96gb": "9.0",
            "h200": "9.0", "h800": "9.0", "b200": "10.0", "mi300x": "gfx942"}
    assert {name: load_hardware(name).compute_capability for name in want} == want
    assert all("compute_capability" in load_raw("hardware", name)["sources"] for name in want)


def test_the_h800_is_an_h100_with_its_nvlink_cut():
    """NVIDIA's H800 datasheet: NVLink 400 GB/s both ways (the H100 SXM5's 900), the H100's tensor cores, HBM3
    and SMs; the DeepSeek-V3 report (arXiv 2412.19437, 3.2.2): 160 GB/s of NVLink usable, IB 50 GB/s."""
    h800, h100 = load_hardware("h800"), load_hardware("h100-sxm")
    assert h800.intra_node_bandwidth == 200e9 and h100.intra_node_bandwidth == 450e9
    assert h800.intra_node_bandwidth * h800.efficiency.intra_node_comm == pytest.approx(160e9)
    assert h800.inter_node_bandwidth == h100.inter_node_bandwidth == 50e9
    same = ("memory_bytes", "hbm_bandwidth", "sm_count", "efficiency", "gpus_per_node")
    assert [getattr(h800, f) for f in same] == [getattr(h100, f) for f in same]
    assert h800.peak_flops("bf16") == h100.peak_flops("bf16") and h800.peak_flops("fp8") == h100.peak_flops("fp8")


@pytest.mark.parametrize("value", [9.0, "9.0; rm -rf", "x" * 40, "\uff19.0", "abc", "9", "sm90"])
def test_compute_capability_must_be_a_short_name(value):
    with pytest.raises(SpecError, match="compute_capability must be text such as"):
        hardware_from_dict(_raw(compute_capability=value), "a100.json")


def test_a_file_without_compute_capability_loads():
    data = _raw()
    del data["compute_capability"], data["sources"]["compute_capability"]
    assert hardware_from_dict(data, "mine.json").compute_capability == ""


def test_a_hardware_file_of_another_format_version_is_refused():
    """A file saying another schema version than the one this autotune reads is an error, not silently read."""
    import json as _json
    from pathlib import Path

    from autotune.specs.hardware import HARDWARE_SCHEMA, hardware_from_dict

    catalog = _json.loads((Path(__file__).resolve().parents[2] / "profiles" / "hardware" / "h100-sxm.json").read_text())
    assert catalog["schema"] == HARDWARE_SCHEMA
    hardware_from_dict(dict(catalog), "h100-sxm.json")
    hardware_from_dict({k: v for k, v in catalog.items() if k != "schema"}, "h100-sxm.json")  # optional
    with pytest.raises(SpecError, match="schema 'autotune.hardware/9' is not a version this autotune reads"):
        hardware_from_dict({**catalog, "schema": "autotune.hardware/9"}, "h100-sxm.json")


def test_bf16_before_ampere_is_a_warning_naming_the_fix():
    """NVIDIA GPUs have bf16 tensor cores from compute capability 8.0 (Ampere): a bf16 job on a V100 is costed at
    the fp16 figure its file carries, which bf16 does not reach there, so it warns; fp16 and newer GPUs do not."""
    v100 = load_hardware("v100-32gb")
    (warning,) = v100.dtype_warnings("bf16")
    assert "compute capability 7.0, no bf16 tensor cores" in warning
    assert warning.endswith("train in fp16 (--dtype fp16)")
    with pytest.raises(SpecError, match="--dtype fp8: v100-32gb has no fp8 tensor cores; use fp16"):
        v100.peak_flops("fp8")
    assert v100.dtype_warnings("fp16") == ()
    assert all(load_hardware(g).dtype_warnings("bf16") == () for g in ("a100-80gb", "h100-sxm", "b200", "mi300x"))


def test_plan_on_a_v100_in_bf16_warns_once(autotune_proc):
    proc = autotune_proc("plan", "--model", "gpt-1.7b", "--gpu", "v100-32gb", "--gpus", "8", "--global-batch", "64",
                         "--seq-len", "2048", "--brief")
    assert proc.returncode == 0 and proc.stderr.count("warning: bf16 on v100-32gb") == 1, proc.stderr
    fp16 = autotune_proc("plan", "--model", "gpt-1.7b", "--gpu", "v100-32gb", "--gpus", "8", "--global-batch", "64",
                         "--seq-len", "2048", "--brief", "--dtype", "fp16")
    assert fp16.returncode == 0 and fp16.stderr.count("warning:") == 1  # flash attention, below
    quiet = autotune_proc("plan", "--model", "gpt-1.7b", "--gpu", "v100-32gb", "--gpus", "8", "--global-batch", "64",
                          "--seq-len", "2048", "--brief", "--dtype", "fp16", "--no-flash-attention")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr


def test_flash_attention_before_ampere_is_a_warning_naming_the_fix():
    """FlashAttention-2 and Transformer Engine's fused attention need compute capability 8.0: a V100 plan costed
    with them (the default) says so and names --no-flash-attention (user-tester: 71.5% MFU on a V100)."""
    v100 = load_hardware("v100-32gb")
    (warning,) = v100.kernel_warnings("fp16", True)
    assert "flash attention on v100-32gb (compute capability 7.0" in warning
    assert warning.endswith("cost the unfused attention that runs with --no-flash-attention")
    assert v100.kernel_warnings("fp16", False) == () and len(v100.kernel_warnings("bf16", True)) == 2
    assert all(load_hardware(g).kernel_warnings("bf16", True) == () for g in ("a100-80gb", "h100-sxm", "mi300x"))


def test_emit_of_a_v100_bf16_plan_warns_once(autotune_proc, tmp_path):
    doc = autotune_proc("plan", "--model", "gpt-1.7b", "--gpu", "v100-32gb", "--gpus", "8", "--global-batch", "64",
                        "--seq-len", "2048", "--json", "--no-timings")
    assert doc.returncode == 0, doc.stderr
    (tmp_path / "plan.json").write_text(doc.stdout)
    proc = autotune_proc("emit", "--plan", str(tmp_path / "plan.json"), "--trainer", "megatron",
                         "--out", str(tmp_path / "run"))
    assert proc.returncode == 0 and proc.stderr.count("warning: bf16 on v100-32gb") == 1, proc.stderr
