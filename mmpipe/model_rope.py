"""Which positions the model behind a processor class takes, read offline from transformers' own
tables (no checkpoint, no download): a property of the model class, not of a kind of family. The
generic path (`mmpipe.media.processor.position_inputs`) asks it so it never hands a model
positions it cannot compute exactly.

processor class -> its model types (``PROCESSOR_MAPPING_NAMES``) -> for each: the default config
(``CONFIG_MAPPING[model_type]()``, its text config's rope) and the model classes the auto
mappings register for it. A model type whose rope carries an ``mrope_section`` (M-RoPE) or
whose model class has ``get_rope_index`` (transformers' 3-D position rule: Qwen-VL, GLM-4.xV,
GLM-4.6V, Ernie-VL, the Omni thinkers...) takes multi-dimensional positions; every model type of
the processor found with neither takes ``0..n-1`` (Idefics3, LLaVA, Mllama, PaliGemma, Gemma 3).
A class transformers does not map (a user's processor) is "unknown".

    >>> model_rope("Idefics3Processor").kind, model_rope("Glm46VProcessor").kind   # doctest: +SKIP
    ('1d', 'multi')
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["ModelRope", "model_rope"]


@dataclass(frozen=True)
class ModelRope:
    """``kind``: "1d" (positions [B, L] ``0..n-1``), "multi" (the model's own multi-dimensional
    rule: only the model computes them) or "unknown"; ``detail``: what was found, for messages."""

    processor_class: str
    kind: str
    detail: str

    @property
    def one_d(self) -> bool:
        return self.kind == "1d"


def _model_types(processor_class: str) -> list[str]:
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    def names(v):
        return v if isinstance(v, (list, tuple)) else (v,)

    return sorted(t for t, v in PROCESSOR_MAPPING_NAMES.items() if processor_class in names(v))


def _model_classes(model_type: str) -> list[type]:
    """Every model class an auto mapping registers for ``model_type`` (the Omni thinkers sit
    only in the task mappings), imported lazily; a class that fails to import is skipped."""
    import transformers
    from transformers.models.auto import modeling_auto

    found = []
    for name in dir(modeling_auto):
        table = getattr(modeling_auto, name)
        if not (name.endswith("_MAPPING_NAMES") and isinstance(table, dict)) or model_type not in table:
            continue
        for cls in (table[model_type] if isinstance(table[model_type], (list, tuple)) else (table[model_type],)):
            try:
                found.append(getattr(transformers, cls))
            except Exception:  # a class needing an absent extra: the others still answer
                continue
    return found


def _mrope_section(config):
    """The text config's ``mrope_section`` (5.x ``rope_parameters``, 4.x ``rope_scaling``,
    per layer type or flat), None without one."""
    try:
        text = config.get_text_config(decoder=True)
    except Exception:
        text = config
    for attr in ("rope_parameters", "rope_scaling"):
        rope = getattr(text, attr, None)
        if not isinstance(rope, dict):
            continue
        for params in (rope, *[v for v in rope.values() if isinstance(v, dict)]):
            if params.get("mrope_section"):
                return list(params["mrope_section"])
    return None


def _sub_configs(config, depth: int = 0) -> list:
    """``config`` and its sub-configs, depth first (an Omni model's thinker holds the rule)."""
    out = [config]
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        if depth < 3 and sub is not None and hasattr(sub, "model_type"):
            out += _sub_configs(sub, depth + 1)
    return out


def _one_type(model_type: str) -> tuple[bool, str]:
    """(multi-dimensional?, why) for one model type: its config's rope, then the model classes
    of its own and its sub-configs' model types."""
    from transformers import CONFIG_MAPPING

    try:
        configs = _sub_configs(CONFIG_MAPPING[model_type]())
    except Exception:  # a default config that cannot be built: its own model classes still answer
        configs = []
    section = next((s for s in map(_mrope_section, configs[:1]) if s), None)
    if section:
        return True, f"{model_type}: mrope_section {section}"
    types = dict.fromkeys([model_type] + [c.model_type for c in configs if c.model_type])
    for t in types:
        rules = sorted({c.__name__ for c in _model_classes(t) if hasattr(c, "get_rope_index")})
        if rules:
            return True, f"{model_type}: {rules[0]}.get_rope_index (multi-dimensional rope)"
    rules = sorted({c.__name__ for c in _modeling_classes(configs[:1]) if hasattr(c, "get_rope_index")})
    if rules:
        return True, f"{model_type}: {rules[0]}.get_rope_index (multi-dimensional rope)"
    return False, f"{model_type}: 1-D rope"


def _modeling_classes(configs: list) -> list[type]:
    """The classes of the modeling module beside each config's module: transformers 4.57 maps
    Qwen3-Omni's thinker (which holds ``get_rope_index``) in no auto mapping, so the auto tables
    alone called its rope 1-D and the generic path handed the thinker wrong 1-D positions."""
    import importlib
    import inspect

    found = []
    for config in configs:
        module = type(config).__module__
        if ".configuration_" not in module:
            continue
        try:
            modeling = importlib.import_module(module.replace(".configuration_", ".modeling_"))
        except Exception:  # a modeling module needing an absent extra: the others still answer
            continue
        found += [c for _, c in inspect.getmembers(modeling, inspect.isclass) if c.__module__ == modeling.__name__]
    return found


@functools.lru_cache(maxsize=None)
def model_rope(processor_class: str) -> ModelRope:
    """What the model of ``processor_class`` (a transformers processor class name, e.g. the
    stored ``ProcessorLayout.processor_class``) takes; cached per class."""
    types = _model_types(processor_class or "")
    if not types:
        return ModelRope(processor_class, "unknown", "transformers maps no model to this processor class")
    found = [_one_type(t) for t in types]
    multi = [why for is_multi, why in found if is_multi]
    if multi:
        return ModelRope(processor_class, "multi", "; ".join(multi))
    return ModelRope(processor_class, "1d", "; ".join(why for _, why in found))
