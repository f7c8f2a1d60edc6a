"""ShareGPT / LLaVA rows (``conversations``: ``{"from": "human" | "gpt" | "system", "value": text with
<image> markers}``, the layout of LLaVA-Instruct, ShareGPT4V and LLaMA-Factory's sharegpt datasets)
encode as the same conversation in ``messages`` form, on every kind of family, through
``datasets.map`` (batched or not) and a plain dict batch; the old code refused them ("found columns
['conversations', 'images']"). Tool turns and other speakers, non-text values and a row holding both
``messages`` and ``conversations`` are typed `ParseError` s naming the row, the column and the fix."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.errors import ParseError
from mmpipe.testing import invariants

IMAGES = [Image.new("RGB", (60, 40), (10, 200, 30)), Image.new("RGB", (36, 52), (200, 10, 30))]
TURNS = [("system", "Be brief."), ("human", "<image>\nWho are they?"), ("gpt", "Two players."),
         ("human", "And here?<image>"), ("gpt", "A goal.")]
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


def _sharegpt(turns=TURNS) -> dict:
    return {"conversations": [{"from": f, "value": v} for f, v in turns], "images": IMAGES}


def _messages(turns=TURNS) -> dict:
    return {"messages": [{"role": ROLES[f], "content": v} for f, v in turns], "images": IMAGES}


@pytest.mark.parametrize("family", ["qwen2_vl", "glm4v", "gemma3", "llava_onevision"])
def test_sharegpt_rows_encode_as_their_messages(family):
    from mmpipe import testing

    proc = testing.build_processor(family)
    a, b = mmpipe.encode_row(_sharegpt(), proc, idx=0), mmpipe.encode_row(_messages(), proc, idx=0)
    invariants.assert_rows_equal([a], [b])
    assert (a.labels != -100).sum() > 0 and a.num_images == 2


def test_through_datasets_map_and_a_plain_batch():
    import datasets

    from mmpipe import testing

    proc = testing.build_processor("qwen2_vl")
    want = [mmpipe.encode_row(_messages(), proc, idx=i) for i in range(3)]
    ds = datasets.Dataset.from_list([_sharegpt()] * 3)
    for batched in (False, True):
        out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names, batched=batched)
        invariants.assert_rows_from_arrow(out.data.table, want)
    plain = {"conversations": [_sharegpt()["conversations"]] * 3, "images": [IMAGES] * 3}
    got = mmpipe.encode(plain, processor=proc)
    np.testing.assert_array_equal(np.asarray(got["input_ids"][2]), want[2].input_ids)


@pytest.mark.parametrize("row, words", [
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "function_call", "value": "{}"}]},
     "from='function_call'"),
    ({"conversations": [{"from": "human", "value": ["<image>", "hi"]}]}, "value of type list"),
    ({"conversations": [{"from": "human", "value": "hi"}], "messages": [{"role": "user", "content": "hi"}]},
     "both a 'messages' and a 'conversations' column"),
])
def test_turns_that_are_not_sharegpt_text_are_typed(row, words):
    from mmpipe import testing

    with pytest.raises(ParseError, match=words) as e:
        mmpipe.encode_row(row, testing.build_processor("qwen2_vl"), idx=7)
    assert e.value.row == 7 and e.value.column == "conversations" and e.value.fix


# ---- LLaVA's single `image` / `video` column ---------------------------------------------------
def _llava(image, turns=TURNS[1:3]) -> dict:
    return {"id": "000000033471", "image": image, "conversations": [{"from": f, "value": v} for f, v in turns]}


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_llava_rows_take_their_image_from_the_image_column(family):
    """LLaVA-Instruct / ShareGPT4V rows hold one image under ``image`` (a path, or a datasets
    Image() value). The old code left the ``<image>`` marker as text and encoded the row with
    no image at all: the model never saw the pixels, without a word."""
    from mmpipe import testing

    proc = testing.build_processor(family)
    want = mmpipe.encode_row({"messages": _messages(TURNS[1:3])["messages"], "images": IMAGES[:1]}, proc, idx=0)
    got = mmpipe.encode_row(_llava(IMAGES[0]), proc, idx=0)
    assert got.num_images == 1
    invariants.assert_rows_equal([got], [want])
    # LLaVA-OneVision's multi-image rows: a list under `image`
    two = {"image": IMAGES, "conversations": [{"from": f, "value": v} for f, v in TURNS[1:]]}
    invariants.assert_rows_equal([mmpipe.encode_row(two, proc, idx=0)], [mmpipe.encode_row(_messages(TURNS[1:]), proc, idx=0)])


def test_llava_image_column_through_datasets_and_its_errors(tmp_path):
    import datasets

    from mmpipe import testing

    proc = testing.build_processor("qwen2_vl")
    path = tmp_path / "coco.png"
    IMAGES[0].save(path)
    rows = [_llava(str(path)), {"id": "t", "image": None, "conversations": [{"from": "human", "value": "hi"},
                                                                          {"from": "gpt", "value": "yo"}]}]
    ds = datasets.Dataset.from_list(rows).cast_column("image", datasets.Image())
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names,
                 **mmpipe.map_kwargs(proc, ds))
    want = [mmpipe.encode_row({"messages": _messages(TURNS[1:3])["messages"], "images": IMAGES[:1]}, proc),
            mmpipe.encode_row(rows[1], proc)]
    invariants.assert_rows_from_arrow(out.data.table, want)
    # an image without its <image> marker is refused, naming the column (never silently dropped)
    with pytest.raises(mmpipe.errors.PlaceholderError) as e:
        mmpipe.encode_row(_llava(IMAGES[0], [("human", "Who?"), ("gpt", "Two.")]), proc, idx=4)
    assert e.value.row == 4 and e.value.column == "image"
    # a row's own images column wins over `image`
    both = dict(_llava(IMAGES[1]), images=IMAGES[:1])
    invariants.assert_rows_equal([mmpipe.encode_row(both, proc)], [mmpipe.encode_row(_llava(IMAGES[0]), proc)])


def test_cli_encodes_a_llava_json_with_relative_image_paths(tmp_path, capsys):
    import datasets
    import json

    from mmpipe import testing
    from mmpipe.cli.main import main

    (tmp_path / "coco").mkdir()
    IMAGES[0].save(tmp_path / "coco" / "1.png")
    src = tmp_path / "llava.json"
    src.write_text(json.dumps([_llava("coco/1.png")]))
    rc = main(["encode", str(src), "--processor", "testing:qwen2_vl", "--out", str(tmp_path / "enc"), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    got = datasets.load_from_disk(str(tmp_path / "enc"))
    want = mmpipe.encode_row({"messages": _messages(TURNS[1:3])["messages"], "images": IMAGES[:1]},
                             testing.build_processor("qwen2_vl"))
    assert want.num_images == 1
    invariants.assert_rows_from_arrow(got.data.table, [want])
