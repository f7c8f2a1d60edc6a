"""Rollouts on tiled-family rows (Gemma 3, InternVL, LLaVA-OneVision) with TransformersEngine and
the tiny offline models: sampled at temperature 1.0 (long-ish generations, n=2), the sampled
tokens' logprobs == teacher forcing over prompt + response (rollout_rows -> Collator ->
teacher_forced_logprobs); the model sees the images; the family's image tokens are banned from
responses (and refused in training rows when allowed); layout-only prompts are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import mmpipe
from mmpipe.offline import build_processor
from mmpipe.errors import InputError
from mmpipe.families import family_of
from mmpipe.offline.gemma3 import build_gemma3_model
from mmpipe.offline.tile_builders import build_tiled2_model
from mmpipe.records.generation import SamplingParams
from mmpipe.rollout.results import rollout_rows
from mmpipe.rollout.transformers_engine import TransformersEngine, banned_tokens, response_logprobs, teacher_forced_logprobs

FAMILIES = ("gemma3", "internvl", "llava_onevision")
RNG = np.random.default_rng(17)
IMAGES = [Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(40, 56), (70, 30), (33, 97)]]
MAX_DIFF = 1e-4  # measured: <= 1e-6 (fp32, CPU)


def _prompts(proc, counts=(1, 0, 2), **kw):
    return [mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}] * n
                                             + [{"type": "text", "text": "describe" + " it" * k}]}],
                               "images": IMAGES[:n]}, proc, labels=False, **kw) for k, n in enumerate(counts)]


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request):
    name = request.param
    proc = build_processor(name)
    model = build_gemma3_model() if name == "gemma3" else build_tiled2_model(name)
    return name, proc, model


def _check_teacher_forced(model, proc, prompts, gens) -> list:
    rows = rollout_rows(prompts, gens, proc)
    lengths = [len(c.token_ids) for g in gens for c in g.completions]
    for side in ("right", "left"):
        tf = teacher_forced_logprobs(model, mmpipe.Collator(proc, padding_side=side)(rows)).numpy()
        got = response_logprobs(tf, rows, lengths, side)
        want = [np.asarray(c.logprobs, np.float32) for g in gens for c in g.completions]
        assert max(float(np.abs(a - b).max()) for a, b in zip(got, want)) < MAX_DIFF
    return rows


def test_sampled_logprobs_equal_teacher_forcing(fam):
    name, proc, model = fam
    prompts = _prompts(proc)
    gens = TransformersEngine(model, proc).generate(
        prompts, SamplingParams(max_new_tokens=48, n=2, temperature=1.0, seed=3, logprobs=True))
    assert [len(g.completions) for g in gens] == [2, 2, 2]
    assert sum(len(c.token_ids) for g in gens for c in g.completions) > 6 * 24  # long-ish, mostly to the limit
    rows = _check_teacher_forced(model, proc, prompts, gens)
    assert len(rows) == 6 and all(r.num_images == p.num_images for r, p in zip(rows, [p for p in prompts for _ in "ab"]))
    r = rows[0]
    assert np.array_equal(r.input_ids[:len(prompts[0])], prompts[0].input_ids)
    assert (r.labels[:len(prompts[0])] == -100).all() and np.array_equal(r.labels[len(prompts[0]):],
                                                                         gens[0].completions[0].token_ids)
    assert np.array_equal(r.pixel_values_u8, prompts[0].pixel_values_u8)


def test_the_model_sees_the_images(fam):
    name, proc, model = fam
    prompts = _prompts(proc, counts=(2,))
    params = SamplingParams(max_new_tokens=4, n=1, temperature=0.0, logprobs=True)
    seen = TransformersEngine(model, proc).generate(prompts, params)[0].completions[0]
    blind = TransformersEngine(model, proc, see_images=False).generate(prompts, params)[0].completions[0]
    assert seen.token_ids != blind.token_ids or not np.allclose(seen.logprobs, blind.logprobs, atol=1e-4)
    with pytest.raises(InputError, match="no pixels"):
        TransformersEngine(model, proc).generate(_prompts(proc, counts=(1,), pixels="none"), params)


def test_image_tokens_banned_and_refused(fam):
    """A hook on the LM head pushes the family's feature token up: banned (the default), it never
    appears and the logprobs still match teacher forcing (raw logits); allowed, it does, and the
    training rows refuse the response."""
    name, proc, model = fam
    feature = family_of(proc).token_ids(proc.tokenizer)["feature"]
    assert feature in banned_tokens(proc)
    head = model.get_output_embeddings()

    def push(module, args, out):
        out = out.clone()
        out[..., feature] += 12.0
        return out

    handle = head.register_forward_hook(push)
    try:
        prompts = _prompts(proc, counts=(1, 2))
        engine = TransformersEngine(model, proc)
        gens = engine.generate(prompts, SamplingParams(max_new_tokens=16, n=2, temperature=1.0, seed=1, logprobs=True))
        ids = [t for g in gens for c in g.completions for t in c.token_ids]
        assert not set(ids) & set(banned_tokens(proc))
        _check_teacher_forced(model, proc, prompts, gens)
        allowed = engine.generate(prompts, SamplingParams(max_new_tokens=16, n=2, temperature=1.0, seed=1,
                                                          allow_vision_tokens=True))
        assert feature in [t for g in allowed for c in g.completions for t in c.token_ids]
        with pytest.raises(InputError, match="prompt .* sample .* image token"):
            rollout_rows(prompts, allowed, proc)
    finally:
        handle.remove()
    assert torch.isfinite(head.weight).all()


def test_unbatch_rollout_takes_tiled_rows_and_multiturn_refuses_them(fam):
    """`unbatch_rollout` is one function for every family: on tiled prompts (records, stored
    dicts, with the processor) its samples' training rows are `rollout_rows`' (1-D positions
    continued over the response). Multi-turn `start` is refused with an ArgumentError naming the
    family (not a TypeError or a misleading missing-column error)."""
    from mmpipe.errors import ArgumentError
    from mmpipe.rollout import start, unbatch_rollout

    name, proc, model = fam
    prompts = _prompts(proc, counts=(1,))
    gens = TransformersEngine(model, proc).generate(prompts, SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
    want = rollout_rows(prompts, gens, proc)
    for p, kw in [(prompts, {}), ([r.to_dict() for r in prompts], {}), (prompts, {"processor": proc})]:
        got = [s.to_row() for s in unbatch_rollout(p, gens, **kw)]
        assert [r.diff(w) for r, w in zip(got, want)] == [[]] * len(want)
    assert np.array_equal(want[0].position_ids, np.arange(len(want[0])))
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
           "images": IMAGES[:1]}
    with pytest.raises(ArgumentError, match=f"not available for {name}"):
        start(raw, proc)
