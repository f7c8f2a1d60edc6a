"""Offline fixtures: a real ``transformers`` fast tokenizer (``Qwen2Tokenizer``) built locally.

A small byte-level BPE learned deterministically on a built-in English corpus, plus the Qwen
special tokens (``<|im_start|>``, ``<|vision_start|>``, ``<|image_pad|>``, ...) and a Qwen-style
chat template (`mmpipe.offline.chat_templates`). The special tokens get the same ids in every
family (the tokenizer is the same apart from its chat template).

``build_tokenizer(family, merges="qwen-like")`` adds the whitespace merges of the real Qwen
vocabularies (``ĠĠ``, ``ĊĊ``, ``ĊĊĊ``): a reply starting with a newline then shares one
token with the newline that ends the ``<|im_start|>assistant`` header, as with the real
tokenizers (what assistant-token masks must handle). Its special tokens sit 3 ids higher.
``merges="qwen-punct"`` adds their punctuation merges too (``" <"``, ``".\\n\\n"``, ``":\\n"``,
``"</"``...): text joins across the seams where chat text is assembled from pieces, which the
default set hides.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import TYPE_CHECKING

from mmpipe.compat import extra_special_tokens_key, is_transformers_5
from mmpipe.errors import ArgumentError
from mmpipe.families import DEFAULT_FAMILY, GLM4V, VISION_FAMILIES
from mmpipe.offline.chat_templates import chat_template

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "FAMILY_NAMES", "SPECIAL_TOKENS", "EXTRA_TOKENS", "MERGE_SETS", "build_tokenizer", "special_token_ids",
    "check_family", "OWN_BUILDERS", "base_tokenizer", "CORPUS",
]

# Vision families whose offline tokenizer / processor / model come from a module of their own
# (its build_tokenizer / build_processor / build_model); build_processor and build_model hand over.
# (each module's offline_processor(family, min_pixels, max_pixels) / offline_model(family, seed))
OWN_BUILDERS = {GLM4V.name: "mmpipe.offline.glm4v", "glm46v": "mmpipe.offline.glm46v",
                "gemma3": "mmpipe.offline.gemma3", "internvl": "mmpipe.offline.internvl", "llava_onevision": "mmpipe.offline.onevision"}
# the families the Qwen builders here make (every other vision family)
FAMILY_NAMES = tuple(f for f in VISION_FAMILIES if f not in OWN_BUILDERS)

# Special tokens in the order of the real Qwen2-VL / Qwen2.5-VL / Qwen3-VL vocabularies
# (151643 ... 151656 there); here they follow the BPE vocabulary directly.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Added but not special (as in the Qwen2.5 / Qwen3 vocabularies): kept by decode(skip_special_tokens=True).
EXTRA_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

# Pre-tokenisation regex of the Qwen2 tokenizer (same as transformers' Qwen2Tokenizer).
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_BPE_VOCAB_SIZE = 640  # 256 byte tokens + up to 384 merges

# Merges appended (lowest priority) to the learned ones, per merge set of build_tokenizer. The
# corpus is learned line by line, so it never merges whitespace runs; real Qwen vocabularies do
# ("ĊĊ" is one token there), and a reply starting with "\n" then merges with its header's "\n".
_QWEN_LIKE = (("Ġ", "Ġ"), ("Ċ", "Ċ"), ("ĊĊ", "Ċ"))


def _punctuation_merges() -> tuple:
    """The punctuation merges of the real Qwen vocabularies that join text across the places where
    chat text is assembled: space + punctuation (``" <"``, ``" ("``), punctuation runs
    (``"</"``, ``"?!"``, ``'":'``), punctuation + newlines (``".\\n"``, ``":\\n\\n"``, ``"?\\n"``,
    ``">\\n"``) and whitespace before a newline (``" \\n"``)."""
    pairs = [("Ġ", "Ċ"), ("ĠĠ", "Ċ"), ("<", "/"), ("/", ">"), ("?", '"'), (".", '"'), ('"', ","), ('"', ":"),
             ("{", '"'), ('"', "}"), ("}", "}"), (")", "."), (")", ","), ("*", "*"), (".", "."), ("..", "."),
             ("-", "-"), ("!", "!"), ("?", "?"), ("?", "!"), (")", ":"), ('"', "."), ("}", ","), ("]", ",")]
    pairs += [("Ġ", p) for p in ("<", "(", "[", "{", '"', "'", "-", "*", "#", ":", ".", "?", "=", "/", "`", "</")]
    for p in (".", ":", "?", "!", ",", ">", ")", "}", "]", '"', "*", ";"):
        pairs += [(p, "Ċ"), (p, "ĊĊ"), (p + "Ċ", "Ċ")]
    return tuple(pairs)


_EXTRA_MERGES = {
    "default": (),
    "qwen-like": _QWEN_LIKE,
    "qwen-punct": _QWEN_LIKE + _punctuation_merges(),
}
MERGE_SETS = tuple(_EXTRA_MERGES)  # the accepted values of build_tokenizer(merges=...)

# A small built-in English corpus (written for this module) to learn the BPE merges on, so text
# is not one token per character. Changing it changes every token id above 255: don't.
CORPUS = """\
You are a helpful assistant. Describe this image in one sentence.
What is shown in the picture? Please answer the question about the image.
The photograph shows a woman in a uniform standing in front of a flag.
The picture shows a small red box on a wooden table next to a window.
There is a cat sitting on the chair, and a dog sleeping under the table.
A man is riding a bicycle along the river while the sun is setting behind the hills.
The image contains two people, three cars and a large building with many windows.
How many objects are there in the image? There are four objects in the image.
What color is the car? The car is blue. What color is the sky? The sky is grey.
Look at the chart and tell me which value is the largest and which one is the smallest.
The table lists the number of students in each class for the first and the second year.
Read the text in the image and translate it into English.
The document is a letter written by hand; the first line says good morning.
Answer with a single word. Answer with a number. Think step by step before you answer.
The answer is correct. The answer is wrong. Let me think about this question again.
First, we count the apples: there are seven apples on the left and five on the right.
So the total number of apples is twelve, and the final answer is twelve.
The model reads the images and the text together and then writes a short reply.
Each image is split into patches, and the patches are merged into tokens for the language model.
The video shows a person walking through a park, then sitting down on a bench to read.
In the first frame the door is open; in the last frame the door is closed.
The weather today is warm and sunny, with a light wind from the west.
She opened the window, looked at the garden and smiled at the flowers.
They went to the market in the morning and came back with bread, cheese and fruit.
The train leaves the station at nine and arrives in the city before noon.
Please write a short story about a robot that learns to paint pictures of the sea.
The robot painted the sea in the morning light, with white boats and blue waves.
A good caption is short, accurate and mentions the most important objects in the scene.
The search tool returned three results; the second result contains the answer.
Call the tool with the query, wait for the response, and then answer the user.
The user asked about the price of the house, and the assistant gave a clear answer.
This is a test of the tokenizer. It should split common words into a few tokens.
Numbers like 1, 2, 3, 10, 42 and 2024 are written with digits, one token per digit.
The quick brown fox jumps over the lazy dog near the bank of the river.
Where is the ball? The ball is under the table, next to the green chair.
Is there a person in this image? Yes, there is a person holding an umbrella.
The building on the left is taller than the building on the right.
Give the bounding box of the dog in the image, as coordinates of the top left and bottom right corners.
The reward is higher when the answer matches the reference and the format is right.
Training the model with reinforcement learning needs many samples and a good reward.
"""


def check_family(family: str) -> str:
    """``family`` when the offline builders know it (one of :data:`FAMILY_NAMES`); raises
    `mmpipe.errors.ArgumentError` otherwise."""
    if family not in FAMILY_NAMES:
        raise ArgumentError(f"unknown vision family {family!r}; known: {list(FAMILY_NAMES)}")
    return family


@functools.lru_cache(maxsize=1)
def _bpe_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Learn the byte-level BPE on the built-in corpus (deterministic; ~30 ms)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    model = json.loads(tok.to_str())["model"]  # {"type": "BPE", "vocab": {...}, "merges": [...]}
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return dict(model["vocab"]), merges


def _qwen2_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]):
    """A fast Qwen2 tokenizer over ``vocab`` / ``merges`` with Qwen2's normaliser, pre-tokeniser
    and decoder, on either transformers line (`mmpipe.compat`): 5.x's ``Qwen2Tokenizer`` builds
    that pipeline itself; on 4.57 the same ``tokenizers`` pipeline is handed to
    ``Qwen2TokenizerFast`` (4.57's ``Qwen2Tokenizer`` is the slow, file-based one)."""
    kwargs = dict(unk_token=None, bos_token=None, eos_token=None, pad_token=None, errors="replace",
                  model_max_length=32768)
    if is_transformers_5():
        from transformers import Qwen2Tokenizer

        return Qwen2Tokenizer(vocab=dict(vocab), merges=list(merges), **kwargs)
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import Qwen2TokenizerFast

    tk = Tokenizer(models.BPE(vocab=dict(vocab), merges=list(merges), dropout=None, unk_token=None,
                              continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                              byte_fallback=False))
    tk.decoder = decoders.ByteLevel()
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return Qwen2TokenizerFast(tokenizer_object=tk, **kwargs)


def base_tokenizer(merge_set: str = "default"):
    """A fresh fast tokenizer of the learned byte-level BPE alone (no special tokens, no chat
    template): what each family's offline tokenizer adds its own special tokens to."""
    vocab, merges = _bpe_vocab_and_merges()
    vocab, merges = dict(vocab), list(merges)
    for a, b in _EXTRA_MERGES[merge_set]:
        vocab.setdefault(a + b, len(vocab))
        merges.append((a, b))
    return _qwen2_tokenizer(vocab, merges)


@functools.lru_cache(maxsize=None)
def _cached_tokenizer(family: str, merge_set: str = "default"):
    from tokenizers import AddedToken

    tok = base_tokenizer(merge_set)
    # Add the special tokens in Qwen order so their ids are fixed, then name eos / pad.
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in EXTRA_TOKENS])
    tok.add_special_tokens(
        {
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            extra_special_tokens_key(): [t for t in SPECIAL_TOKENS if t not in ("<|endoftext|>", "<|im_end|>")],
        }
    )
    tok.chat_template = chat_template(family)
    tok.name_or_path = f"mmpipe-testing/{family}" + ("" if merge_set == "default" else f"-{merge_set}")
    return tok


def build_tokenizer(family: str = DEFAULT_FAMILY, *, merges: str = "default") -> "PreTrainedTokenizerBase":
    """A small offline ``Qwen2Tokenizer`` (fast, ``tokenizers``-backed) with the Qwen special tokens.

    Byte-level BPE with 256 byte tokens plus merges learned on a built-in English corpus, then
    the :data:`SPECIAL_TOKENS` (special) and :data:`EXTRA_TOKENS` (added, not special); fewer
    than 1024 ids in all. ``pad_token`` is ``<|endoftext|>``, ``eos_token`` is ``<|im_end|>``,
    padding side right (as the real Qwen-VL tokenizers). ``family`` only picks the chat
    template: Qwen2-VL's (also used for Qwen2.5-VL, default system prompt) or a Qwen3-VL-like
    one (no default system prompt). Supports ``return_offsets_mapping=True``.

    ``merges="qwen-like"`` appends the whitespace merges of the real Qwen vocabularies (``ĠĠ``,
    ``ĊĊ``, ``ĊĊĊ``, see :data:`MERGE_SETS`) to the learned ones: text without whitespace runs
    tokenizes as with the default set, ``"\n\n"`` becomes one token, and the special tokens
    sit 3 ids higher (look them up with ``convert_tokens_to_ids``). ``merges="qwen-punct"``
    also appends the punctuation merges of the real vocabularies (space + punctuation,
    punctuation runs, punctuation + newlines: ``" <"``, ``"</"``, ``".\\n\\n"``).

    The tokenizer is built once per family and each call returns a deep copy (~ms), so
    setting ``padding_side`` or other attributes on it cannot leak into other callers.
    """
    if merges not in _EXTRA_MERGES:
        raise ArgumentError(f"merges must be one of {MERGE_SETS}, got {merges!r}")
    return copy.deepcopy(_cached_tokenizer(check_family(family), merges))


def special_token_ids(family: str = DEFAULT_FAMILY) -> dict[str, int]:
    """Token -> id for :data:`SPECIAL_TOKENS` and :data:`EXTRA_TOKENS` (same for every family)."""
    tok = _cached_tokenizer(check_family(family))
    return {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + EXTRA_TOKENS}
