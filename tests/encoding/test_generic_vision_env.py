"""The generic path on the transformers 5.24 VLMs whose image processors need torchvision
(Kimi-K2.5, Phi-4-multimodal, Llama 4) or whose vision tower needs timm (Gemma 3n): run only in
the "vision" environment (scripts/envs/vision.sh), where torchvision's pure-Python part is on
PYTHONPATH and timm is installed; the main .venv deselects them (it runs the first test only: the
builders refuse there with a typed error naming the environment).

Each line: its real processor class (the published chat template and image tokens, tiny image
settings) and a tiny real model class (`mmpipe.offline.vision_env_vlms`), rows of 0..3 images:
encode == the processor's own call (and its chat path), collate == its batch call (both padding
sides), batched logits == the model on each row's own call (both sides), the images count,
``unbatch(collate(rows)) == rows``, the rows through datasets / Arrow, packing refused (a typed
error: the generic path does not know its model's attention). Llama 4's bf16 pixels are stored
float32 (exact) and handed back in bf16 (`ProcessorLayout.dtypes`).

Two things the generic path does as these processors' own chat path and batch call do (they
failed before): Llama 4's and Gemma 3n's templates write the BOS their tokenizers would add again
(the rows hold one, ``add_special_tokens=False`` as ``ProcessorMixin.apply_chat_template``), and
Phi-4-multimodal's batch fills the missing crops' ``image_attention_mask`` with ones
(`ProcessorLayout.pads`, found by the probe).
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.offline.vision_env_vlms import VISION_ENV_NAMES as NAMES
from mmpipe.testing import invariants

from helpers import chat_path, generic_chat_rows, processor_call

vision = pytest.mark.needs_env("vision")  # every test but the first: the main .venv deselects them

COUNTS = [2, 0, 3, 1]  # images per row
SIZES = [(64, 100), (40, 56), (60, 170), (70, 30)]  # several tiles / crops each, in every line
NESTED = ("gemma4",)  # batch calls that take one image list per row (a flat list: Gemma 4 counts it as one row's)
PIXELS = {"kimi_k25": "pixel_values", "phi4_multimodal": "image_pixel_values", "llama4": "pixel_values",
          "gemma3n": "pixel_values", "gemma4": "pixel_values", "step3p7": "pixel_values",
          "glm5_next": "pixel_values"}


def test_builders_need_the_vision_environment():
    """Outside the vision environment (no torchvision / timm) the builders refuse with a typed error
    naming the way there; inside it they build the real processor classes."""
    from mmpipe.offline.vision_env_vlms import build_vision_env_processor, vision_env_available

    with pytest.raises(mmpipe.errors.ArgumentError, match="unknown offline processor"):
        build_vision_env_processor("llava")
    if vision_env_available():
        with pytest.raises(mmpipe.errors.ArgumentError, match="scripts/envs/vision.sh"):
            build_vision_env_processor("llama4")
        return
    classes = [type(build_vision_env_processor(n)).__name__ for n in NAMES]
    assert classes == ["Kimi_K25Processor", "Phi4MultimodalProcessor", "Llama4Processor", "Gemma3nProcessor",
                       "Gemma4Processor", "Step3p7Processor", "Glm5NextProcessor"]


@pytest.fixture(scope="module", params=NAMES)
def line(request):
    """(name, processor, model, raw rows, encoded rows, own-call keywords)."""
    from mmpipe.offline.vision_env_vlms import build_vision_env_model, build_vision_env_processor, vision_env_available

    if vision_env_available():
        pytest.skip(vision_env_available())
    name = request.param
    proc = build_vision_env_processor(name)
    raws = generic_chat_rows(COUNTS, sizes=SIZES)
    rows = [mmpipe.encode_row(r, proc) for r in raws]
    # the processor's own call as mmpipe makes it: the rendered text with the tokenizer's special tokens,
    # or without them where the template wrote the BOS (as the chat path)
    plain = processor_call(proc, raws[:1])["input_ids"][0].numpy()
    kw = {} if np.array_equal(rows[0].input_ids, plain) else {"add_special_tokens": False}
    return name, proc, build_vision_env_model(name), raws, rows, kw


def _as_stored(v: torch.Tensor) -> np.ndarray:
    """A processor output as mmpipe stores it (bf16 / f16 as float32, exact)."""
    return (v.float() if v.dtype in (torch.bfloat16, torch.float16) else v).numpy()


@vision
def test_encode_equals_the_processors_own_call(line):
    name, proc, _, raws, rows, kw = line
    for raw, row in zip(raws, rows):
        own = processor_call(proc, [raw], **kw)
        assert np.array_equal(row.input_ids, own["input_ids"][0].numpy())
        assert set(own) - {"input_ids", "attention_mask"} == set(row.vision) | set(row.sequence)
        for k, v in row.vision.items():
            assert np.array_equal(v, _as_stored(own[k])) and v.dtype == _as_stored(own[k]).dtype, k
        for k, v in row.sequence.items():  # Gemma 3n's token_type_ids
            assert np.array_equal(v, own[k][0].numpy()), k
    assert [len(r.image_hw) for r in rows] == COUNTS


@vision
def test_encode_equals_the_chat_path(line):
    _, proc, _, raws, rows, _ = line
    for raw, row in zip(raws, rows):
        chat = chat_path(proc, raw)
        own = processor_call(proc, [raw], **_bos_rule(proc, raw))  # the chat path is the own call under its BOS rule
        assert np.array_equal(chat["input_ids"][0].numpy(), own["input_ids"][0].numpy())
        assert np.array_equal(row.input_ids, chat["input_ids"][0].numpy()), "encode differs from the chat path"


def _bos_rule(proc, raw) -> dict:
    """ProcessorMixin.apply_chat_template's rule: no added special tokens when the text starts with the BOS."""
    bos = proc.tokenizer.bos_token
    text = proc.apply_chat_template(raw["messages"], tokenize=False)
    return {"add_special_tokens": False} if bos and text.startswith(bos) else {}


@vision
@pytest.mark.parametrize("side", ["left", "right"])
def test_collate_equals_the_processors_own_batch(line, side):
    """Every input of the batch == the processor's batch call (Llama 4's pixels handed back in bf16);
    Phi-4-MM's image_attention_mask at the real crops (padded crops:
    `test_collate_pads_missing_crops_as_the_processor`)."""
    name, proc, _, raws, rows, kw = line
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    own = processor_call(proc, raws, padding=True, padding_side=side, nested=name in NESTED, **kw)
    got = batch.model_inputs()
    assert np.array_equal(batch.input_ids, own["input_ids"].numpy())
    assert np.array_equal(batch.attention_mask, own["attention_mask"].numpy())
    assert set(own) == set(got) - {"position_ids", "labels"}
    for k in set(own) - {"input_ids", "attention_mask"}:
        g = torch.as_tensor(got[k])
        assert g.shape == own[k].shape and g.dtype == own[k].dtype, k
        if name == "phi4_multimodal" and k == "image_attention_mask":
            for i, n in enumerate(_crops(rows)):
                assert torch.equal(g[i, :n], own[k][i, :n]), f"image {i}"
            continue
        assert torch.equal(g, own[k]), k
    assert batch.sample_to_image_indices == [[0, 1], [], [2, 3, 4], [5]]


def _crops(rows) -> list:
    """Phi-4-MM: each image's own crops (its global view + HD crops, before any padding)."""
    from mmpipe.offline.phi4mm import PHI4MM_CROP

    return [int(sizes[0] // PHI4MM_CROP) * int(sizes[1] // PHI4MM_CROP) + 1
            for r in rows if "image_sizes" in r.vision for sizes in r.vision["image_sizes"]]


@vision
@pytest.mark.parametrize("side", ["left", "right"])
def test_collate_pads_missing_crops_as_the_processor(line, side):
    name, proc, _, raws, rows, kw = line
    if name != "phi4_multimodal":
        pytest.skip("Phi-4-multimodal only: its batch pads the crops of smaller images")
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    own = processor_call(proc, raws, padding=True, padding_side=side, **kw)
    assert torch.equal(torch.as_tensor(batch.model_inputs()["image_attention_mask"]), own["image_attention_mask"])


@vision
@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_logits_equal_each_rows_own_call(line, side):
    """The model on the batch at each row's real tokens == the model on the row's own call; the
    images count (blanking one row's pixels moves its logits)."""
    name, proc, model, raws, rows, kw = line
    batch = mmpipe.collate(rows, processor=proc, padding_side=side)
    refs = [dict(processor_call(proc, [raw], **kw)) for raw in raws]
    invariants.assert_batched_logits_match(model, rows, proc, batch=batch, references=refs, atol=1e-5, rtol=1e-5)
    key = PIXELS[name]
    with torch.no_grad():
        blank = dict(refs[3], **{key: torch.zeros_like(refs[3][key])})
        assert (model(**refs[3]).logits - model(**blank).logits).abs().max().item() > 1e-3


@vision
@pytest.mark.parametrize("side", ["left", "right"])
def test_unbatch_collate_is_the_rows(line, side):
    _, proc, _, _, rows, _ = line
    batch = invariants.assert_roundtrip(rows, processor=proc, padding_side=side)
    # the zero-image row comes back without vision keys and with the batch's (= its own) layout
    assert not rows[1].vision and batch.layout == rows[1].layout


@vision
def test_stored_rows_through_arrow(line):
    """encode -> datasets.map -> Arrow rows (and Python records) -> Collator -> unbatch == the rows."""
    _, proc, _, raws, rows, _ = line
    ds = datasets.Dataset.from_list(raws)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=ds.column_names)
    invariants.assert_rows_from_arrow(enc.data.table, rows)
    invariants.assert_rows_equal(invariants.as_rows(enc.to_list()), rows, what="Arrow records")
    for side in ("left", "right"):
        batch = mmpipe.Collator(proc, padding_side=side)(mmpipe.ArrowRows(enc).__getitems__(range(len(enc))))
        invariants.assert_roundtrip(rows, batch)


@vision
def test_packing_is_refused(line):
    """The generic path does not know its model's attention: packing is refused with a typed error."""
    _, proc, _, _, rows, _ = line
    with pytest.raises(mmpipe.errors.PackingUnsupportedError, match="generic path"):
        mmpipe.pack(rows, processor=proc)


@vision
def test_stored_bytes_per_image(line):
    """One image's stored outputs are the processor's own, float32 (Llama 4: its bf16 pixels widened,
    twice the processor's bytes, exact)."""
    name, proc, _, _, _, kw = line
    raw = generic_chat_rows([1], sizes=[(64, 100)])[0]
    row = mmpipe.encode_row(raw, proc)
    own = processor_call(proc, [raw], **kw)
    stored = sum(v.nbytes for v in row.vision.values())
    as_float32 = sum(_as_stored(own[k]).nbytes for k in row.vision)
    native = sum(own[k].numel() * own[k].element_size() for k in row.vision)
    assert stored == as_float32
    assert native == (stored - row.vision["pixel_values"].nbytes // 2 if name == "llama4" else stored)


@vision
def test_low_precision_pixels_round_trip(line):
    """Llama 4: the layout records bf16, the stored column is float32 and the model gets bf16 back,
    bit-identical to the processor's, also from Arrow rows."""
    name, proc, _, raws, rows, kw = line
    if name != "llama4":
        assert rows[0].layout.dtypes == ()
        return
    assert rows[0].layout.dtypes == (("pixel_values", "bfloat16"),)
    assert dict((n, t) for n, t, _ in rows[0].layout.vision)["pixel_values"] == "float32"
    ds = datasets.Dataset.from_list(raws)
    back = mmpipe.rows_from_arrow(ds.map(mmpipe.encode, fn_kwargs={"processor": proc},
                                         remove_columns=ds.column_names).data.table)
    for raw, row in zip(raws, back):
        if raw["images"]:
            pv = mmpipe.collate([row], processor=proc).model_inputs()["pixel_values"]
            own = processor_call(proc, [raw], **kw)["pixel_values"]
            assert pv.dtype == torch.bfloat16 and torch.equal(pv, own)


@vision
def test_gemma4_template_labels_and_thinking(line):
    """Gemma 4's template (its published structure): a reply's thinking channel is not rendered, so it is
    not a label; consecutive assistant messages continue one model turn, both labelled; with
    ``enable_thinking`` the rows equal the processor's chat path with it (the system turn's ``<|think|>``)."""
    name, proc, _, raws, _, _ = line
    if name != "gemma4":
        pytest.skip("Gemma 4's template only")
    tok = proc.tokenizer

    def labelled(row):
        return tok.decode(row.input_ids[row.labels != -100])

    thought = {"messages": [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "<|channel>thought\nlet me see<channel|>Hello there"}]}
    row = mmpipe.encode_row(thought, proc)
    assert "let me see" not in tok.decode(row.input_ids) and labelled(row) == "Hello there<turn|>"
    two = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "One."}, {"role": "assistant", "content": "Two."}]}
    row = mmpipe.encode_row(two, proc)
    assert tok.decode(row.input_ids).count("<|turn>model") == 1 and labelled(row) == "One.<turn|>Two.<turn|>"
    raw = raws[0]
    row = mmpipe.encode_row(raw, proc, chat_template_kwargs={"enable_thinking": True})
    own = chat_path(proc, raw, enable_thinking=True)
    assert np.array_equal(row.input_ids, own["input_ids"][0].numpy()) and "<|think|>" in tok.decode(row.input_ids)
    assert np.array_equal(row.sequence["mm_token_type_ids"], own["mm_token_type_ids"][0].numpy())
    assert labelled(row) == raw["messages"][1]["content"][0]["text"] + "<turn|>"


@vision
def test_outputs_only_some_images_give_are_in_the_layout(line):
    """Step-3.7 returns ``pixel_values_local`` only for images with local crops (elongated or larger than
    its view), and none for a call whose images have none (the 64x64 layout probes): the layout knows the
    key all the same (a probe of an elongated and a large image), so rows with crops encode (they raised
    "returned 'pixel_values_local', which its probe did not show") and every row has one layout."""
    name, proc, _, _, rows, _ = line
    if name != "step3p7":
        pytest.skip("Step-3.7 only")
    assert "pixel_values_local" in {n for n, _, _ in rows[0].layout.vision}
    assert "pixel_values_local" in rows[0].vision and "pixel_values_local" not in rows[3].vision
    square = mmpipe.encode_row(generic_chat_rows([1], sizes=[(64, 64)])[0], proc)
    assert square.layout == rows[0].layout and "pixel_values_local" not in square.vision


@vision
def test_glm5_next_sparse_attention_batches_as_the_processors_own_batch(line):
    """GLM-5.3-Flash's sparse attention layers keep ``index_topk`` keys per query, picked in pools by an
    indexer that sees the batch's padding: where a row is longer than that budget and padded in its batch,
    the model can give it other logits than alone, on either padding side (measured on a tiny model with
    ``index_topk=16``: 0.13 and 0.10 for two of the three padded rows). Not mmpipe's doing: the batch's inputs are the processor's own batch call's,
    bit for bit, and that call's logits differ from the rows alone by exactly as much; the unpadded row, and
    every row with a budget above the rows (the fixture's model), equal their own call."""
    name, proc, _, raws, rows, kw = line
    if name != "glm5_next":
        pytest.skip("GLM-5.3-Flash only")
    from mmpipe.offline.glm5_next import build_model

    torch.manual_seed(0)
    model = build_model(index_topk=16).eval()
    for side in ("left", "right"):
        batch = mmpipe.collate(rows, processor=proc, padding_side=side).model_inputs()
        own = processor_call(proc, raws, padding=True, padding_side=side, **kw)
        assert all(torch.equal(torch.as_tensor(batch[k]), own[k]) for k in own)
        with torch.no_grad():
            ours, theirs = model(**batch).logits, model(**own).logits
            gaps = []
            for i, raw in enumerate(raws):
                alone = model(**processor_call(proc, [raw], **kw)).logits[0]
                real = own["attention_mask"][i].bool()
                gaps.append((float((ours[i][real] - alone).abs().max()), float((theirs[i][real] - alone).abs().max())))
        print(f"\nglm5_next, index_topk=16, {side} padding: gap to each row alone (mmpipe, the processor's batch): {gaps}")
        assert all(a == b for a, b in gaps)  # the same forward inputs, the same logits
        lengths = [len(r) for r in rows]
        assert all(gap < 1e-4 for (gap, _), n in zip(gaps, lengths) if n == max(lengths))  # the unpadded row
        assert any(gap > 1e-3 for (gap, _), n in zip(gaps, lengths) if n < max(lengths))  # the model's property


@vision
def test_gemma4_videos_are_refused_with_the_way_out(line, tmp_path):
    """Gemma 4 takes videos and clips, but the generic path takes a video only with its sound, as the Omni
    thinkers' templates write it: a video row is the row's ParseError naming the videos column, and
    ``use_audio_in_video=True`` (Gemma 4's template writes no sound for a video) is an ArgumentError at the
    first row, not the processor's raw ValueError from the probe."""
    name, proc, _, _, _, _ = line
    if name != "gemma4":
        pytest.skip("Gemma 4 only")
    from mmpipe.audio.samples import video_with_sound

    path, _ = video_with_sound(2.0, fmt="mp4", sound=True)
    raw = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "what?"}]},
                        {"role": "assistant", "content": "a ball"}], "videos": [path]}
    with pytest.raises(mmpipe.errors.ParseError, match="takes images only") as err:
        mmpipe.encode_row(raw, proc)
    assert err.value.column == "videos" and "drop the row's videos" in str(err.value)
    with pytest.raises(mmpipe.errors.ArgumentError, match="use_audio_in_video=True: processor Gemma4Processor failed"):
        mmpipe.encode_row(raw, proc, use_audio_in_video=True)
