"""Offline fixtures for the transformers 5.24 / 5.25 VLMs whose image processors need torchvision
(Kimi-K2.5, Phi-4-multimodal, Llama 4, Step-3.7; Gemma 4's and GLM-5.3-Flash's processors their video
processors) or whose vision
tower needs timm (Gemma 3n): their real
processor classes around the real image processors at tiny settings, the offline BPE
(`mmpipe.offline.tokenizer.base_tokenizer`) with each checkpoint's special tokens and the
published chat template written in, and tiny random models of the real transformers classes.
mmpipe has no family table for them: they take the generic path (`mmpipe.media.processor_encode`).
They build only where torchvision (and timm) import: the "vision" test environment
(scripts/envs/vision.sh: torchvision's pure-Python part on PYTHONPATH, timm installed with
--no-deps), never the main .venv::

    >>> proc = build_vision_env_processor("llama4")         # doctest: +SKIP
    >>> model = build_vision_env_model("llama4")            # doctest: +SKIP

One module per line holds its facts (what the builders carry over from the published
checkpoints; nothing fetched is stored) and its tiny settings: `mmpipe.offline.kimi`,
`mmpipe.offline.phi4mm`, `mmpipe.offline.llama4`, `mmpipe.offline.gemma3n`, `mmpipe.offline.gemma4`, `mmpipe.offline.step3p7`, `mmpipe.offline.glm5_next` (each
``build_processor()`` / ``build_model()``). This module holds what they share (the tokenizer
builder) and the builders by name.
"""

from __future__ import annotations

import copy
import functools
import importlib
import tempfile

from mmpipe.errors import ArgumentError

__all__ = ["VISION_ENV_NAMES", "build_vision_env_processor", "build_vision_env_model", "vision_env_available",
           "offline_tokenizer", "ids"]

# name -> the module of its builders
_MODULES = {"kimi_k25": "mmpipe.offline.kimi", "phi4_multimodal": "mmpipe.offline.phi4mm",
            "llama4": "mmpipe.offline.llama4", "gemma3n": "mmpipe.offline.gemma3n", "gemma4": "mmpipe.offline.gemma4",
            "step3p7": "mmpipe.offline.step3p7", "glm5_next": "mmpipe.offline.glm5_next"}
VISION_ENV_NAMES = tuple(_MODULES)
# name -> its stock processor class (transformers 4.57 lacks the 5.x lines': checked before torchvision)
_PROCESSORS = {"kimi_k25": "Kimi_K25Processor", "phi4_multimodal": "Phi4MultimodalProcessor",
               "llama4": "Llama4Processor", "gemma3n": "Gemma3nProcessor", "gemma4": "Gemma4Processor",
               "step3p7": "Step3p7Processor", "glm5_next": "Glm5NextProcessor"}


def vision_env_available() -> str:
    """"" when torchvision and timm import (the vision environment), else why not."""
    import importlib.util

    missing = [m for m in ("torchvision", "timm") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(missing)} not importable (run scripts/envs/vision.sh)" if missing else ""


def _module(name: str):
    if name not in _MODULES:
        raise ArgumentError(f"unknown offline processor {name!r}; use one of {VISION_ENV_NAMES}")
    import transformers

    if not hasattr(transformers, _PROCESSORS[name]):
        raise ArgumentError(f"{name}: transformers {transformers.__version__} has no {_PROCESSORS[name]} (it came with "
                            "transformers 5); install transformers>=5 to build it")
    why = vision_env_available()
    if why:
        raise ArgumentError(f"{name}: its image processor needs torchvision (Gemma 4's processor: its video processor; "
                            f"Gemma 3n's tower: timm): {why}")
    return importlib.import_module(_MODULES[name])


def offline_tokenizer(special: tuple, *, bos=None, eos=None, pad=None, named=None, add_bos=False, template=None):
    """The offline BPE with ``special`` added as special tokens, bos / eos / pad named, ``named``
    as named extra special tokens (``tokenizer.image_token`` / ``image_token_id``...), the BOS
    prepended by the tokenizer itself where ``add_bos`` (as the Llama / Gemma tokenizers do), and
    the chat ``template``."""
    from tokenizers import AddedToken

    from mmpipe.offline.tokenizer import base_tokenizer

    tok = base_tokenizer()
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in special], special_tokens=True)
    tok.add_special_tokens({k: v for k, v in dict(bos_token=bos, eos_token=eos, pad_token=pad).items() if v})
    with tempfile.TemporaryDirectory() as d:
        tok.save_pretrained(d)
        tok = type(tok).from_pretrained(d, extra_special_tokens=dict(named or {}))
    if add_bos:
        tok.add_bos_token = True  # the tokenizers post-processor prepends bos, as the published one does
    tok.chat_template = template
    return tok


def ids(tok, *tokens) -> list:
    """The ids of ``tokens``."""
    return [tok.convert_tokens_to_ids(t) for t in tokens]


def build_vision_env_processor(name: str):
    """The real processor of ``name`` (one of `VISION_ENV_NAMES`) at tiny image settings, with the
    offline tokenizer holding the checkpoint's special tokens and chat template; a fresh object
    per call. `ArgumentError` outside the vision environment (torchvision / timm not importable)."""
    return _module(name).build_processor()


@functools.lru_cache(maxsize=4)
def _cached_model(name: str, seed: int):
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _module(name).build_model().eval()


def build_vision_env_model(name: str, seed: int = 0):
    """A tiny random model of ``name``'s real transformers class matching
    `build_vision_env_processor` (sizes: each line's ``build_model``), fp32 (Llama 4's vision tower
    bf16), eval mode; a deep copy of a cached model per call."""
    _module(name)
    return copy.deepcopy(_cached_model(name, int(seed)))
