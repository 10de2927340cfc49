"""Plans no trainer runs exactly (zb-h1, v-half, vocabulary parallelism): a saved plan.json with them reads back
(autotune/emit/document.py), every trainer emits the closest config with warnings, and `autotune emit --strict`
turns those warnings into exit 1 with nothing written."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from autotune.cli import main
from autotune.emit.document import emit_input_from_document
from autotune.emit import TRAINERS, EmitInput, emit

from .scenarios import GOLDEN

CASES = {
    "vocab_parallel": GOLDEN["vocab_parallel"],
    "v_half": GOLDEN["v_half"],
    "zb_h1": replace(GOLDEN["v_half"], plan=replace(GOLDEN["v_half"].plan, schedule="zb-h1", vpp=1)),
}
#: The warning each trainer gives for each case, by its first words.
EXPECTED = {
    "vocab_parallel": "vocab parallel: ",
    "v_half": "schedule v-half: ",
    "zb_h1": "schedule zb-h1: ",
}


def _document(inp: EmitInput) -> dict:
    """What `autotune plan --json` saves (the catalog model by name)."""
    return {"plan": inp.plan.to_dict(),
            "job": {"model": inp.model.name, "gpu": inp.gpu, "gpus_per_node": inp.gpus_per_node,
                    "global_batch": inp.job.global_batch, "seq_len": inp.job.seq_len},
            "step_time_s": inp.step_time_s, "peak_memory_gib": inp.peak_memory_gib, "mfu": inp.mfu}


@pytest.mark.parametrize("case", list(CASES))
def test_plan_documents_read_back(case: str) -> None:
    inp = CASES[case]
    assert emit_input_from_document(json.loads(json.dumps(_document(inp))), "plan.json") == inp


@pytest.mark.parametrize("trainer", TRAINERS)
@pytest.mark.parametrize("case", list(CASES))
def test_every_trainer_warns(case: str, trainer: str) -> None:
    warnings = emit(trainer, CASES[case]).warnings
    assert any(w.startswith(EXPECTED[case]) for w in warnings), warnings
    assert all("\n" not in w and w == w.strip() for w in warnings)


@pytest.mark.parametrize("trainer", TRAINERS)
@pytest.mark.parametrize("case", list(CASES))
def test_strict_refuses(case: str, trainer: str, capsys, tmp_path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_document(CASES[case])))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["emit", "--plan", str(path), "--trainer", trainer, "--strict", "--out", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and not out.exists()
    assert f"warning: {EXPECTED[case]}" in err
    assert err.splitlines()[-1].startswith(f"error: --strict: {trainer} cannot express this plan exactly")
    with pytest.raises(SystemExit) as exc:  # without --strict: the closest config, and the same warnings
        main(["emit", "--plan", str(path), "--trainer", trainer, "--out", str(out)])
    assert exc.value.code in (0, None) and out.is_dir() and any(out.iterdir())
