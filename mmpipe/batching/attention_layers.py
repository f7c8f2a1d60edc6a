"""Which layers a model has, and whether each keeps rows packed end to end apart.

A pack (`mmpipe.batching.packing`) hands the model ONE ``[1, T]`` sequence and marks where each
row starts only by position ids restarting at 0 (no attention mask, no cache). Whether the rows
then stay apart is up to each layer of the text stack (`LAYER_BOUNDARIES`):

- ``full_attention``, ``sliding_attention``: transformers finds the rows from the restarting
  positions (``masking_utils.find_packed_sequence_indices``) and builds a block-diagonal causal
  mask for eager / sdpa / flex attention (a sliding window inside each row), or varlen
  sequences for flash attention. Measured exact (tests/batching/test_packing_models.py).
- ``linear_attention`` (Qwen3.5 and Qwen3-Next gated delta rule, Mamba), ``conv``, ``hybrid``:
  a recurrent state and a causal convolution run through the whole sequence and transformers'
  torch kernels take no row boundaries, so each row starts from the state the row before left
  (measured on tiny Qwen3.5 / Qwen3.5-MoE: packed logits off by 0.06 / 0.04 from the second row).
- ``cross_attention`` (Mllama), ``bidirectional_image`` (Gemma 3, PaliGemma: image tokens attend
  both ways, a mask transformers builds from positions in the whole pack), ``bidirectional``,
  ``encoder_decoder`` (T5Gemma 2: its encoder attends both ways over the whole input),
  ``chunked_attention`` and any type not listed: refused (known wrong, or never checked).

The types are read from the config (`model_layers`), in this order: the text config's
``layer_types`` (legacy ``"mamba"`` / ``"attention"`` renamed as transformers 5 does); Mllama's
``cross_attention_layers``; a recurrent field (`RECURRENT_FIELDS`) for every layer; a sliding
window (Qwen2's ``use_sliding_window`` / ``max_window_layers`` rule); else full attention for
every layer - a config that names no other kind (Qwen3-VL, GLM-4.1V / 4.5V, LLaMA-style text
configs). ``source`` says which. This works the same on transformers 4.57 (fewer configs carry
``layer_types`` there; a config dict of a model 4.57 lacks, e.g. a Qwen3.5 ``config.json``,
is read too).

Example::

    layers = model_layers(model)           # or its config, or a config.json dict
    layers.layer_types                     # ('linear_attention', 'full_attention', ...)
    check_packing(model)                   # PackingUnsupportedError naming linear_attention
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from mmpipe.compat import transformers_version
from mmpipe.errors import ArgumentError, PackingUnsupportedError

__all__ = ["LAYER_BOUNDARIES", "LAYER_REFUSALS", "ATTENTION_IMPLEMENTATIONS", "RECURRENT_FIELDS",
           "BIDIRECTIONAL_IMAGE_MODELS", "PACKED_POSITIONS_SINCE", "ModelLayers", "model_layers", "check_packing",
           "check_family_line"]

_ROWS = "position_ids restarting at 0 per row"
# layer type -> the row boundary it honours in a pack
LAYER_BOUNDARIES = {
    "full_attention": f"{_ROWS}: a block-diagonal causal mask (eager, sdpa, flex) or varlen rows (flash)",
    "sliding_attention": f"{_ROWS}: the block-diagonal causal mask, its window inside each row",
    "moe": "none needed: it mixes no tokens", "sparse": "none needed: it mixes no tokens",
    "dense": "none needed: it mixes no tokens",
}
_STATE = ("run through the whole pack and transformers' kernels take no row boundaries: each row "
          "starts from the state the row before left")
# layer type -> why it does not keep packed rows apart
LAYER_REFUSALS = {
    "linear_attention": f"carry a recurrent state and a causal convolution that {_STATE}",
    "conv": f"carry a causal convolution whose window and cache {_STATE}",
    "hybrid": f"add a recurrent (Mamba-like) state that would {_STATE}",
    "hybrid_sliding": f"add a recurrent (Mamba-like) state that would {_STATE}",
    "cross_attention": "attend the images through a cross-attention mask built per batch row: in one "
                       "packed row every row would see every image of the pack",
    "bidirectional_image": "let image tokens attend both ways, a mask transformers builds from positions "
                           "in the whole pack: from the second row on, tokens see later tokens (measured "
                           "on Gemma 3: logits off by up to 0.41)",
    "bidirectional": "attend both ways, which a causal pack of rows does not describe (never checked)",
    "encoder_decoder": "run an encoder that attends both ways over its whole input, so in a pack every row "
                       "would see the others, and a decoder whose rows do not match the pack's (never checked)",
    "chunked_attention": "attend in fixed chunks that transformers 4.x counts from the start of the pack "
                         "(never checked)",
}
# how a model's attention kernels find the rows: measured eager, sdpa, flex (CPU); flash takes
# transformers' varlen path from the same restarting positions (not measured here: no CUDA)
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")
# text-config fields that mean recurrent layers when a config lists no layer_types
RECURRENT_FIELDS = ("mamba_d_state", "mamba_d_conv", "ssm_state_size", "state_size", "conv_kernel", "d_conv",
                    "lru_width", "linear_conv_kernel_dim", "block_types", "layers_block_type",
                    "hybrid_override_pattern", "attn_layer_period")
# model types whose image tokens attend both ways (transformers 5.24's gemma3 / paligemma models,
# which read token_type_ids; ShieldGemma 2 checkpoints load Gemma3ForConditionalGeneration with their
# own model type); Gemma 4 says so in use_bidirectional_attention="vision"
BIDIRECTIONAL_IMAGE_MODELS = ("gemma3", "paligemma", "shieldgemma2")
# model types whose text stack takes a pack's ``position_ids [4, 1, T]`` (text row first) only from
# this transformers major: 4.57's Glm4vTextModel has no text-row branch and hands the four rows to
# the mask builder, which raises a RuntimeError (expand of [4, 1, T]) on every packed forward
PACKED_POSITIONS_SINCE = {"glm4v": 5, "glm4v_moe": 5}
_ATTENTION_KINDS = tuple(k for k in LAYER_BOUNDARIES if k.endswith("attention"))
_LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}
_TEXT_KEYS = ("text_config", "llm_config", "language_config")
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


@dataclass(frozen=True)
class ModelLayers:
    """A model's text stack as packing sees it: ``layer_types`` one per decoder layer,
    ``model_wide`` kinds of the whole model (``"bidirectional_image"``), ``source`` where the
    types were read, ``attn_implementation`` the text stack's (None: not set on a config)."""

    model_type: str
    layer_types: tuple[str, ...]
    model_wide: tuple[str, ...] = ()
    source: str = "layer_types"
    attn_implementation: Optional[str] = None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The distinct layer types, in layer order, then the model-wide kinds."""
        return tuple(dict.fromkeys(self.layer_types + self.model_wide))

    def layers_of(self, kind: str) -> tuple[int, ...]:
        """The decoder layer indices of ``kind`` (all of them for a model-wide kind)."""
        if kind in self.model_wide:
            return tuple(range(len(self.layer_types)))
        return tuple(i for i, t in enumerate(self.layer_types) if t == kind)

    def refused(self) -> dict[str, str]:
        """kind -> why it does not keep packed rows apart; empty when every kind does."""
        return {k: LAYER_REFUSALS.get(k, "are a layer type mmpipe has not checked with packed rows")
                for k in self.kinds if k not in LAYER_BOUNDARIES}

    def boundaries(self) -> dict[str, str]:
        """kind -> the row boundary it honours (the kinds that do)."""
        return {k: LAYER_BOUNDARIES[k] for k in self.kinds if k in LAYER_BOUNDARIES}

    def __str__(self) -> str:
        counts = ", ".join([f"{len(self.layers_of(k))} x {k}" for k in dict.fromkeys(self.layer_types)]
                           + [f"{k} (model-wide)" for k in self.model_wide])
        return f"{self.model_type}: {counts} ({self.source}); attention {self.attn_implementation or 'not set'}"


def model_layers(model: Any) -> ModelLayers:
    """The layers of ``model``: a transformers model, its config, or a ``config.json`` dict."""
    outer, text = _configs(model)
    model_type = str(_get(outer, "model_type") or _get(text, "model_type") or type(outer).__name__)
    types, source = _layer_types(text)
    wide = []
    both_ways = _get(text, "use_bidirectional_attention")
    if model_type in BIDIRECTIONAL_IMAGE_MODELS or both_ways == "vision":
        wide.append("bidirectional_image")
    if both_ways is True or both_ways == "all":
        wide.append("bidirectional")
    if _get(outer, "is_encoder_decoder") is True:
        wide.append("encoder_decoder")
    impl = _get(text, "_attn_implementation") or _get(outer, "_attn_implementation")
    return ModelLayers(model_type, types, tuple(wide), source, impl if isinstance(impl, str) else None)


def check_packing(model: Any, who: str = "pack") -> ModelLayers:
    """``model``'s layers (`model_layers`) when every one keeps packed rows apart under its
    attention implementation; else `PackingUnsupportedError` naming the layer type, its layers,
    why, and the alternative (padded batches, `mmpipe.Collator`)."""
    layers = model_layers(model)
    fix = "use mmpipe.Collator(processor) for padded batches"
    _check_line(who, layers.model_type, PACKED_POSITIONS_SINCE.get(layers.model_type), "model")
    if not layers.layer_types:
        raise PackingUnsupportedError(
            f"{who}: the {layers.model_type} config names no layer types or layer count, so whether its layers "
            f"keep packed rows apart cannot be checked; {fix}", model_type=layers.model_type)
    refused = layers.refused()
    if refused:
        kind, why = next(iter(refused.items()))  # the first in layer order
        at = layers.layers_of(kind)
        raise PackingUnsupportedError(
            f"{who}: packing is not available for this {layers.model_type} model: its {kind} layers "
            f"({len(at)} of {len(layers.layer_types)}: {_some(at)}, from {layers.source}) {why}; expected only "
            f"layers that keep packed rows apart ({', '.join(_ATTENTION_KINDS)}); {fix}",
            layer_type=kind, layers=at, model_type=layers.model_type)
    impl = layers.attn_implementation
    if impl is not None and impl not in ATTENTION_IMPLEMENTATIONS:
        raise PackingUnsupportedError(
            f"{who}: packing is not available for this {layers.model_type} model with attn_implementation="
            f"{impl!r}: it is not known to find packed rows from restarting positions (expected one of "
            f"{list(ATTENTION_IMPLEMENTATIONS)}); set attn_implementation='sdpa', or {fix}",
            layer_type="full_attention", layers=layers.layers_of("full_attention"), model_type=layers.model_type)
    return layers


def check_family_line(family: Any, who: str = "pack") -> None:
    """Without a model: `PackingUnsupportedError` when every model type of ``family`` (a
    `ModelFamily`) takes packed positions only from a newer transformers major than the installed
    one (`PACKED_POSITIONS_SINCE`: GLM-4.1V / 4.5V on 4.x). Any such model this process builds is
    the installed version's class, whose forward raises on every pack, so the rows are refused
    when packed rather than at the first training step."""
    types = tuple(getattr(family, "model_types", ()) or ())
    since = [PACKED_POSITIONS_SINCE.get(t) for t in types]
    if types and None not in since:
        _check_line(who, family.name, min(since), "family's models")


def _check_line(who: str, model_type: str, since: Optional[int], what: str) -> None:
    """`PackingUnsupportedError` when ``since`` (the transformers major from which ``model_type``'s
    text stack takes a pack's positions) is above the installed major."""
    if since is None or transformers_version()[0] >= since:
        return
    import transformers

    raise PackingUnsupportedError(
        f"{who}: packing is not available for this {model_type} {what} on transformers "
        f"{transformers.__version__}: "
        f"its text model takes the pack's position_ids [4, 1, T] (text positions restarting per row, then "
        f"the M-RoPE rows) only from transformers {since}, and this version's forward raises on them; "
        f"expected transformers>={since}; install transformers>={since}, or use mmpipe.Collator(processor) "
        f"for padded batches", model_type=model_type)


def _some(at: tuple[int, ...], n: int = 8) -> str:
    return "layers " + ", ".join(map(str, at[:n])) + (", ..." if len(at) > n else "")


# ---- reading configs (transformers objects or config.json dicts) ----------------------------
def _get(cfg: Any, name: str) -> Any:
    if isinstance(cfg, dict):
        return cfg.get(name)
    try:
        return getattr(cfg, name, None)
    except Exception:  # a config property that cannot answer (e.g. a field it derives from is unset)
        return None


def _configs(model: Any) -> tuple[Any, Any]:
    """(the outer config, the text stack's config) of a model, a config or a dict."""
    cfg = getattr(model, "config", model)
    if not isinstance(cfg, dict) and not hasattr(cfg, "to_dict"):
        raise ArgumentError(f"model must be a transformers model, its config or a config.json dict, "
                            f"got {type(model).__name__}")
    text = next((_get(cfg, k) for k in _TEXT_KEYS if _get(cfg, k) is not None), None)
    if text is None and hasattr(cfg, "get_text_config"):
        text = cfg.get_text_config(decoder=True)
    return cfg, text if text is not None else cfg


def _layer_types(text: Any) -> tuple[tuple[str, ...], str]:
    """(one type per decoder layer, where it was read) from a text config."""
    listed = _get(text, "layer_types")
    if listed:
        return tuple(_LEGACY.get(t, t) for t in listed), "layer_types"
    n = next((_get(text, k) for k in _LAYER_COUNT_KEYS if isinstance(_get(text, k), int)), None)
    if n is None:
        return (), "no layer count"
    cross = _get(text, "cross_attention_layers")
    if cross:
        return tuple("cross_attention" if i in set(cross) else "full_attention" for i in range(n)), \
            "cross_attention_layers"
    field = next((f for f in RECURRENT_FIELDS if _get(text, f) is not None), None)
    if field is not None:
        return ("linear_attention",) * n, f"recurrent field {field} (no layer_types)"
    if _get(text, "sliding_window") is not None and _get(text, "use_sliding_window") is not False:
        first = _get(text, "max_window_layers") or 0
        return tuple("sliding_attention" if i >= first else "full_attention" for i in range(n)), "sliding_window"
    return ("full_attention",) * n, "no layer_types: full attention, the config names no other kind"
