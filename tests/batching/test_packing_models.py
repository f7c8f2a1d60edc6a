"""Packing that knows the model (mmpipe.batching.attention_layers): the model lines that load
with the Qwen3-VL processor, built tiny from transformers' own classes (mmpipe.offline.qwen3_5),
rows with 0..3 images. Padded batches equal each row alone on every one; packing is exact where
the layers keep the rows apart (Qwen3-VL, Qwen3-VL-MoE) and refused with
`PackingUnsupportedError` where they do not (Qwen3.5, Qwen3.5-MoE: linear attention) - and the
refusal is measured to be needed. Then the layer types read from the configs of every family
mmpipe supports and the 2026 lines, and the one warning when no model is given."""

from __future__ import annotations

import logging

import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.batching import packing
from mmpipe.batching.attention_layers import PACKED_POSITIONS_SINCE, ModelLayers, check_packing, model_layers
from mmpipe.compat import transformers_version
from mmpipe.errors import ArgumentError, PackingUnsupportedError
from mmpipe.offline.qwen3_5 import MODEL_LINES
from mmpipe.testing import invariants

from conftest import processor_for
from helpers import processor_reference

QWEN3_VL = mmpipe.family_of("qwen3_vl").name
COUNTS = (0, 1, 3, 2)  # images per row
EXACT = (QWEN3_VL, "qwen3_vl_moe")  # every layer keeps packed rows apart
REFUSED = ("qwen3_5", "qwen3_5_moe")  # linear-attention layers carry state across rows
MODELS = EXACT + REFUSED


def _model(name: str):
    if name in MODEL_LINES:
        import transformers

        if not hasattr(transformers, MODEL_LINES[name]):
            pytest.skip(f"transformers {transformers.__version__} has no {MODEL_LINES[name]} (transformers 5 only)")
    return testing.build_model(name)


def _raw(n_images: int, k: int) -> dict:
    images = [testing.tiny_image(48 + 37 * i, 80 + 13 * k, seed=10 * k + i) for i in range(n_images)]
    content = [{"type": "text", "text": f"Row {k}: look."}]
    for j in range(n_images):
        content += [{"type": "image"}, {"type": "text", "text": f" image {j}."}]
    msgs = [{"role": "user", "content": content}, {"role": "assistant", "content": "fine " * (k + 1)}]
    return {"messages": msgs, "images": images}


@pytest.fixture(scope="module")
def raws():
    return [_raw(n, k) for k, n in enumerate(COUNTS)]


@pytest.fixture(scope="module")
def rows(raws):
    return [mmpipe.encode_row(r, processor_for(QWEN3_VL)) for r in raws]


def _gaps(packed, out, alone) -> list[float]:
    return [float((x - a).abs().max()) for x, a in zip(packed.split(out.logits), alone)]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", MODELS)
def test_padded_batch_logits_equal_each_row_alone(name, side, raws, rows):
    """Sanity for every line: the padded batch's logits equal each row alone, the row alone run
    from the processor's own output (its chat template and call)."""
    proc, model = processor_for(QWEN3_VL), _model(name)
    refs = [{k: v for k, v in processor_reference(proc, r["messages"], r["images"]).items()} for r in raws]
    invariants.assert_batched_logits_match(model, rows, proc, references=refs, padding_side=side,
                                           rtol=0, atol=1e-4)  # measured <= 3.0e-7


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", EXACT)
def test_packing_is_exact_where_every_layer_keeps_rows_apart(name, attn, rows):
    proc, model = processor_for(QWEN3_VL), _model(name)
    model.set_attn_implementation(attn)
    collator = mmpipe.PackingCollator(proc, model=model)
    assert isinstance(collator.layers, ModelLayers) and collator.layers.kinds == ("full_attention",)
    assert collator.layers.attn_implementation == attn
    packed = collator(rows)
    out = invariants.assert_packed_logits_match(model, rows, proc, packed=packed, rtol=0, atol=1e-4)
    alone = [model(**mmpipe.collate([r], processor=proc).model_inputs()).logits[0].detach() for r in rows]
    assert max(_gaps(packed, out, alone)) < 1e-4  # measured <= 1.8e-7
    invariants.assert_pack_roundtrip(rows, packed=mmpipe.pack(rows, processor=proc, model=model.config))


@pytest.mark.parametrize("name", REFUSED)
def test_packing_is_refused_where_linear_attention_carries_state(name, rows):
    """Qwen3.5 lines: PackingCollator / pack with the model (or its config, or its config.json
    dict) raise PackingUnsupportedError naming linear_attention and padded batches. The guard:
    the pack built without the model gives row 0 its own logits and every later row different
    ones (the state the row before left), while the padded batch of the same rows is exact."""
    proc, model = processor_for(QWEN3_VL), _model(name)
    for given in (model, model.config, model.config.to_dict()):
        with pytest.raises(PackingUnsupportedError, match="linear_attention layers .*mmpipe.Collator") as e:
            mmpipe.PackingCollator(proc, model=given)
        assert e.value.layer_type == "linear_attention" and e.value.layers == (0,)
        assert isinstance(e.value, ArgumentError)  # old `except ArgumentError` clauses still catch it
    with pytest.raises(PackingUnsupportedError, match="pack: packing is not available for this qwen3_5"):
        mmpipe.pack(rows, processor=proc, model=model)
    packed = mmpipe.pack(rows, processor=proc)  # what packing did without the model: silently wrong
    with torch.no_grad():
        out = model(**packed.model_inputs(labels=False))
        alone = [model(**mmpipe.collate([r], processor=proc).model_inputs(labels=False)).logits[0] for r in rows]
    gaps = _gaps(packed, out, alone)
    assert gaps[0] < 1e-5 and min(gaps[1:]) > 1e-2, gaps  # measured 0 then 0.061 (Qwen3.5), 0.041 (MoE)
    invariants.assert_batched_logits_match(model, rows, proc, padding_side="right", rtol=0, atol=1e-4)


def test_sliding_window_layers_pack_exactly():
    """A text model with a sliding-window layer (window 3, rows of 7-12 tokens): the window
    matters (logits differ from the same weights with full attention) and the pack is exact
    under eager, sdpa and flex attention."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = testing.build_tokenizer(QWEN3_VL)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=3,
                      max_window_layers=0, layer_types=["sliding_attention", "full_attention"])
    rows = [mmpipe.encode_row({"messages": [{"role": "user", "content": "hi " * (2 * i + 1)}]}, tok, labels=False)
            for i in range(3)]
    refs = [{"input_ids": torch.from_numpy(r.input_ids)[None]} for r in rows]
    for attn in ("eager", "sdpa", "flex_attention"):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = Qwen2ForCausalLM._from_config(cfg, attn_implementation=attn).eval()
        assert model_layers(model).layer_types == ("sliding_attention", "full_attention")
        packed = mmpipe.PackingCollator(tok, model=model)(rows)
        invariants.assert_packed_logits_match(model, rows, tok, packed=packed, references=refs, rtol=0, atol=1e-5)
    full = Qwen2ForCausalLM._from_config(Qwen2Config(**{**cfg.to_dict(), "use_sliding_window": False,
                                                         "layer_types": ["full_attention"] * 2})).eval()
    full.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (full(**refs[2]).logits - model(**refs[2]).logits).abs().max() > 1e-3


def test_gemma3_is_refused_by_its_family_and_by_its_layers():
    """The family table's refusal (Gemma 3) raises the same typed error; a Gemma 3 model is
    refused by its layers too (bidirectional image blocks)."""
    from mmpipe.offline.gemma3 import build_gemma3_model, build_gemma3_processor

    with pytest.raises(PackingUnsupportedError, match="packing is not available for gemma3"):
        mmpipe.PackingCollator(build_gemma3_processor())
    with pytest.raises(PackingUnsupportedError, match="bidirectional_image") as e:
        check_packing(build_gemma3_model())
    assert e.value.layer_type == "bidirectional_image" and e.value.model_type == "gemma3"


def test_unknown_attention_and_unreadable_configs_are_refused():
    """An attention implementation not known to find packed rows is refused naming it; so is a
    config whose layers cannot be read, and an object that is no model or config."""
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "_attn_implementation": "paged_attention"}
    with pytest.raises(PackingUnsupportedError, match="attn_implementation='paged_attention'.*'sdpa'"):
        check_packing(cfg)
    with pytest.raises(PackingUnsupportedError, match="names no layer types or layer count"):
        check_packing({"model_type": "mystery"})
    with pytest.raises(ArgumentError, match="transformers model, its config or a config.json dict"):
        check_packing("Qwen/Qwen3.5-9B")


def test_one_warning_per_process_without_a_model(caplog, rows):
    """Without ``model=`` the families known to pack still pack (the pack equals the one made
    with a checked model), and one line per process says the model's layers were not checked."""
    proc = processor_for(QWEN3_VL)
    packing.UNCHECKED_WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="mmpipe"):
        collator = mmpipe.PackingCollator(proc)
        p = collator(rows)
        mmpipe.PackingCollator(proc)
        mmpipe.pack(rows, processor=proc)
    lines = [r.getMessage() for r in caplog.records if "without knowing the model's layers" in r.getMessage()]
    assert len(lines) == 1 and "model=model" in lines[0] and "Qwen3.5" in lines[0], lines
    assert collator.layers is None
    checked = mmpipe.PackingCollator(proc, model=testing.build_model(QWEN3_VL).config)(rows)
    assert torch.equal(checked.input_ids, p.input_ids) and torch.equal(checked.position_ids, p.position_ids)


# ---- layer types read from configs ----------------------------------------------------------
# model type -> (the layer kinds read from its default config, the kind packing is refused for)
CONFIGS = {
    "qwen2_vl": (("full_attention",), None),
    "qwen2_5_vl": (("full_attention",), None),
    "qwen3_vl": (("full_attention",), None),
    "glm4v": (("full_attention",), None),
    "internvl": (("full_attention",), None),
    "llava_onevision": (("full_attention",), None),
    "gemma3": (("sliding_attention", "full_attention", "bidirectional_image"), "bidirectional_image"),
    "qwen3_vl_moe": (("full_attention",), None),
    "glm4v_moe": (("full_attention",), None),
    "glm46v": (("full_attention",), None),
    "qwen3_5": (("linear_attention", "full_attention"), "linear_attention"),
    "qwen3_5_moe": (("linear_attention", "full_attention"), "linear_attention"),
    "qwen3_next": (("linear_attention", "full_attention"), "linear_attention"),
    "mllama": (("full_attention", "cross_attention"), "cross_attention"),
    "llama4": (("chunked_attention", "full_attention"), "chunked_attention"),
}


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_layer_types_read_from_configs(model_type):
    from transformers import CONFIG_MAPPING, AutoConfig

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type} config")
    kinds, refused = CONFIGS[model_type]
    config = AutoConfig.for_model(model_type)
    for given in (config, config.to_dict()):
        layers = model_layers(given)
        assert layers.model_type == model_type and layers.kinds == kinds, str(layers)
        assert len(layers.layer_types) == config.get_text_config(decoder=True).num_hidden_layers
        since = PACKED_POSITIONS_SINCE.get(model_type)
        if since is not None and transformers_version()[0] < since:  # GLM-4.1V on 4.x: its forward fails on packs
            with pytest.raises(PackingUnsupportedError, match=f"install transformers>={since}"):
                check_packing(given)
        elif refused is None:
            assert check_packing(given) == layers and set(layers.boundaries()) == set(kinds)
        else:
            with pytest.raises(PackingUnsupportedError, match=f"its {refused} layers") as e:
                check_packing(given)
            assert e.value.layer_type == refused and e.value.model_type == model_type


def test_qwen3_5_config_json_is_read_without_its_class():
    """A Qwen3.5 config.json (as the hub ships it: layer_types in text_config) is read from the
    dict alone - what transformers 4.57, which has no Qwen3.5 class, can still say."""
    cfg = {"model_type": "qwen3_5", "text_config": {
        "model_type": "qwen3_5_text", "num_hidden_layers": 4, "full_attention_interval": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"]}}
    layers = model_layers(cfg)
    assert layers.layer_types == ("linear_attention",) * 3 + ("full_attention",) and layers.source == "layer_types"
    with pytest.raises(PackingUnsupportedError, match=r"linear_attention layers \(3 of 4: layers 0, 1, 2") as e:
        check_packing(cfg, who="PackingCollator")
    assert e.value.model_type == "qwen3_5"
    legacy = model_layers({"model_type": "jamba", "layer_types": ["mamba", "attention"]})
    assert legacy.layer_types == ("linear_attention", "full_attention")
    mamba = model_layers({"model_type": "mamba", "num_hidden_layers": 2, "state_size": 16})
    assert mamba.layer_types == ("linear_attention",) * 2 and "state_size" in mamba.source


def test_readme_block_runs_as_written(capsys):
    import transformers

    if not hasattr(transformers, MODEL_LINES["qwen3_5"]):
        pytest.skip(f"transformers {transformers.__version__} has no {MODEL_LINES['qwen3_5']}")
    from helpers import readme_block

    ns: dict = {}
    exec(compile(readme_block("**Packing that knows the model.**"), "README.md", "exec"), ns)
    assert isinstance(ns["collator"], mmpipe.Collator)  # the refusal's alternative
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("qwen3_vl_moe: 2 x full_attention (") and printed[0].endswith("attention eager")
    assert printed[1] == "linear_attention (0,)"
