"""render/estimate.py's plan-document model: what a saved plan records of the model, read back exactly."""

from __future__ import annotations

from dataclasses import replace

from autotune.catalog import load_model
from autotune.render.estimate import model_spec_json
from autotune.specs.model import model_from_dict


def test_newer_model_keys_are_written_only_where_set_and_read_back():
    """rotary_fraction and parallel_block are newer than the plan documents earlier releases read strictly: a
    model without them writes neither (so such a release still reads its plan), one with them writes both, and
    either document reads back to the same model."""
    llama = load_model("llama3-8b")
    neox = replace(llama, name="neox-like", rotary_fraction=0.25, parallel_block=True)
    plain, partial = model_spec_json(llama), model_spec_json(neox)
    assert not {"rotary_fraction", "parallel_block"} & set(plain)
    assert (partial["rotary_fraction"], partial["parallel_block"]) == (0.25, True)
    for model, doc in ((llama, plain), (neox, partial)):
        doc = {k: v for k, v in doc.items() if not (k == "max_position_embeddings" and v == 0)}
        assert model_from_dict(doc, "plan.json: model_spec") == model
