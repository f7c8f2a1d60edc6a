"""One invariant harness over every model line mmpipe builds offline (issue 27, point 4): each
line's real processor and a tiny model of its transformers class, rows of 0..3 images, through
the one record -> collate / unbatch both padding sides, the Arrow round trip, batched logits ==
each row alone, and packing exact where the model's layers allow it, refused (with the reason)
where they do not. The expected packing outcome is part of the table: a line that starts to
pack, or stops, fails here.

Per-line depth (bit-exactness to each processor, positions against get_rope_index, videos) is in
the family's own test file; this is the breadth check that every line passes the same harness.
"""

from __future__ import annotations

import datasets
import pytest

import mmpipe
from mmpipe.batching.packing import pack
from mmpipe.errors import ArgumentError, PackingUnsupportedError
from mmpipe.offline import build_model, build_processor
from mmpipe.offline.other_vlms import build_foreign_model, build_foreign_processor
from mmpipe.testing import invariants

from helpers import generic_chat_rows

COUNTS = [2, 0, 3, 1]  # images per row
SIZES = [(40, 56), (70, 30), (56, 56), (64, 100)]

NATIVE = "native"
GENERIC = "generic"
FAMILY_REFUSAL = "family"  # refused by the family table (layer_type None)

# line -> (processor builder name, path, packing: None = exact, else the refused layer type)
LINES = {
    "qwen2_vl": ("qwen2_vl", NATIVE, None),
    "qwen2_5_vl": ("qwen2_5_vl", NATIVE, None),
    "qwen3_vl": ("qwen3_vl", NATIVE, None),
    "qwen3_vl_moe": ("qwen3_vl", NATIVE, None),
    "qwen3_5": ("qwen3_vl", NATIVE, "linear_attention"),
    "qwen3_5_moe": ("qwen3_vl", NATIVE, "linear_attention"),
    "glm4v": ("glm4v", NATIVE, None),
    "glm46v": ("glm46v", NATIVE, None),
    "gemma3": ("gemma3", NATIVE, FAMILY_REFUSAL),
    "internvl": ("internvl", NATIVE, None),
    "llava_onevision": ("llava_onevision", NATIVE, None),
    "idefics3": ("idefics3", GENERIC, FAMILY_REFUSAL),
    "llava": ("llava", GENERIC, FAMILY_REFUSAL),
    "minicpmv4_6": ("minicpmv4_6", GENERIC, FAMILY_REFUSAL),
    "minicpmv4_7": ("minicpmv4_7", GENERIC, FAMILY_REFUSAL),
    "ovis2": ("ovis2", GENERIC, FAMILY_REFUSAL),
}


def _build(line: str):
    name, path, _ = LINES[line]
    try:
        if path == NATIVE:
            return build_processor(name), build_model(line)
        return build_foreign_processor(name), build_foreign_model(name)
    except (ArgumentError, ImportError, AttributeError) as e:  # a class this transformers lacks (4.x)
        import transformers

        pytest.skip(f"{line} cannot be built on transformers {transformers.__version__}: {e}")


@pytest.fixture(scope="module", params=list(LINES))
def line(request):
    """(line name, processor, model, encoded rows)."""
    proc, model = _build(request.param)
    rows = [mmpipe.encode_row(r, proc) for r in generic_chat_rows(COUNTS, sizes=SIZES)]
    return request.param, proc, model, rows


def test_the_line_takes_its_path(line):
    name, _, _, rows = line
    generic = {r.family for r in rows} == {"generic"}
    assert generic == (LINES[name][1] == GENERIC), {r.family for r in rows}
    assert [r.num_images for r in rows] == COUNTS


@pytest.mark.parametrize("side", ["left", "right"])
def test_roundtrip_and_batched_logits(line, side):
    name, proc, model, rows = line
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    invariants.assert_roundtrip(rows, batch, label=f"{name} {side}")
    assert [len(x) for x in batch.sample_to_image_indices] == COUNTS
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, atol=1e-4, rtol=1e-4)


def test_arrow_roundtrip(line):
    name, _, _, rows = line
    table = datasets.Dataset.from_list([r.to_dict() for r in rows]).with_format("arrow")[:]
    invariants.assert_rows_from_arrow(table, rows, label=name)


def test_packing_exact_or_refused_with_the_reason(line):
    name, proc, model, rows = line
    refused = LINES[name][2]
    if refused is None:
        packed = pack(rows, processor=proc, model=model)
        invariants.assert_packed_logits_match(model, rows, proc, packed=packed, atol=1e-4, rtol=1e-4)
        invariants.assert_pack_roundtrip(rows, packed, label=name)
        return
    with pytest.raises(PackingUnsupportedError) as e:
        mmpipe.PackingCollator(proc, model=model)
    assert e.value.layer_type == (None if refused == FAMILY_REFUSAL else refused), str(e.value)
    assert "mmpipe.Collator" in str(e.value)
