"""transformers 5.25 model types whose checkpoints load a native family's processor: Qwen4-Exp
(``qwen4_exp``: the Qwen3-VL processor per transformers' auto mapping), Cosmos3 Omni (``cosmos3_omni``:
its Reasoner IS a Qwen3-VL model), GLM-OCR (``glm_ocr``: ships ``Glm46VProcessor``) and GLM-GA
(``glmga``: ``Glm46VForConditionalGeneration`` itself). The processor gives the family's rows; the
model, its config and its ``config.json`` must name the same family (they raised
UnsupportedProcessorError: "model type 'qwen4_exp' ... takes the generic path" while the processor was
qwen3_vl). With each line's tiny model (`mmpipe.offline.same_family_lines`): rows == the processor's
own call and chat path, mmpipe's batch logits == the processor batch's and each row alone, positions ==
the model's own get_rope_index, packing exact where the layers allow it and refused (naming the layer
type) for Qwen4-Exp's linear attention / n-gram embeddings. Measured max-abs gaps: about 1e-7."""

from __future__ import annotations

import pytest
import torch

import mmpipe
from mmpipe.batching.attention_layers import check_packing
from mmpipe.batching.packing import pack
from mmpipe.errors import PackingUnsupportedError
from mmpipe.families import GLM46V, QWEN3_VL, family_of, resolve_family
from mmpipe.offline.same_family_lines import LINES, build_line_model, build_line_processor
from mmpipe.rope import get_rope_index, to_verl_positions
from mmpipe.testing import invariants

from helpers import chat_path, generic_chat_rows, processor_call

transformers = pytest.importorskip("transformers")
FAMILY = {"qwen4_exp": QWEN3_VL, "cosmos3_omni": QWEN3_VL, "glm_ocr": GLM46V, "glmga": GLM46V}
COUNTS, SIZES = [1, 0, 2], [(64, 100), (120, 80), (48, 48)]


def _config_class(model_type: str):
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    return CONFIG_MAPPING[model_type]


@pytest.mark.parametrize("model_type", list(FAMILY))
def test_model_config_and_config_json_name_the_processors_family(model_type):
    """Was: UnsupportedProcessorError for the config and its dict, ArgumentError for the name."""
    fam, config = FAMILY[model_type], _config_class(model_type)()
    assert family_of(config) is fam and resolve_family(config) is fam
    assert family_of(config.to_dict()) is fam and family_of(model_type) is fam
    pos, _ = get_rope_index(torch.ones(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long),
                            family=model_type)
    assert pos[:, 0].tolist() == [[0, 1, 2]] * 3


@pytest.fixture(scope="module", params=list(LINES))
def line(request):
    _config_class(request.param)
    proc, model = build_line_processor(request.param), build_line_model(request.param)
    raws = generic_chat_rows(COUNTS, sizes=SIZES)
    return request.param, proc, model, raws, [mmpipe.encode_row(r, proc) for r in raws]


def test_model_and_processor_agree(line):
    name, proc, model, _, rows = line
    assert family_of(model) is family_of(proc) is FAMILY[name]  # was: UnsupportedProcessorError for the model
    assert {r.family for r in rows} == {FAMILY[name].name}


def test_rows_equal_the_processors_call_and_chat_path(line):
    _, proc, _, raws, rows = line
    for raw, row in zip(raws, rows):
        for own in (processor_call(proc, [raw]), chat_path(proc, raw)):
            assert row.input_ids.tolist() == own["input_ids"][0].tolist()
            if raw["images"]:
                got = mmpipe.collate([row], processor=proc).model_inputs()
                torch.testing.assert_close(got["pixel_values"], own["pixel_values"], rtol=0, atol=0)
                assert got["image_grid_thw"].tolist() == own["image_grid_thw"].tolist()


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_logits_and_positions(line, padding_side):
    _, proc, model, raws, rows = line
    batch = invariants.assert_roundtrip(rows, processor=proc, padding_side=padding_side)
    invariants.assert_positions_match_rows(batch, rows, model=model)  # == the model's own get_rope_index
    logits = invariants.assert_batched_logits_match(model, rows, proc, batch=batch, rtol=0, atol=1e-4)
    proc.tokenizer.padding_side = padding_side
    try:
        own = processor_call(proc, raws, padding=True)
    finally:
        proc.tokenizer.padding_side = "right"
    with torch.no_grad():
        want = model(**own).logits
    keep = own["attention_mask"].bool()
    torch.testing.assert_close(logits[keep], want[keep], rtol=0, atol=1e-4)


def test_verl_four_row_positions_give_the_same_logits(line):
    """verl's [4, B, L] (row 0 the text positions; Qwen4-Exp reads it for its masks) == the 3 M-RoPE rows."""
    _, proc, model, _, rows = line
    inputs = mmpipe.collate(rows, processor=proc).model_inputs()
    four = dict(inputs, position_ids=to_verl_positions(inputs["position_ids"], inputs["attention_mask"]))
    with torch.no_grad():
        want, got = model(**inputs).logits, model(**four).logits
    keep = inputs["attention_mask"].bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=0, atol=1e-5)


def test_packing_exact_or_refused_by_layer_type(line):
    name, proc, model, _, rows = line
    if name != "qwen4_exp":
        invariants.assert_packed_logits_match(model, rows, proc, packed=pack(rows, processor=proc, model=model),
                                              atol=1e-4)
        return
    for who in (model, model.config, model.config.to_dict()):
        with pytest.raises(PackingUnsupportedError, match="linear_attention layers \\(2 of 4") as info:
            check_packing(who)
        assert info.value.layer_type == "linear_attention"
    with pytest.raises(PackingUnsupportedError, match="qwen4_exp"):
        pack(rows, processor=proc, model=model)
