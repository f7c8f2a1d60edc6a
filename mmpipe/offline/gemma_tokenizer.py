"""Offline fixtures: a tokenizer built like Gemma's published one (transformers 5's
``GemmaTokenizer``): a SentencePiece-style BPE (spaces normalised to ``▁``, no byte-level
alphabet, byte fallback ``<0x00>``..``<0xFF>``) with merges learned on the built-in corpus
(`mmpipe.offline.tokenizer.CORPUS`), the tokenizer adding ``<bos>`` itself
(``add_bos_token: true``, as the checkpoints' tokenizer_config.json says), newline runs ``"\\n"``
.. ``"\\n\\n\\n\\n"`` as plain added tokens and the turn and image markers as special tokens.

The shared offline tokenizer is a byte-level BPE that adds nothing: on it a template's
``{{ bos_token }}`` and the tokenizer's own BOS, or a newline token after ``<end_of_turn>``, are
never put to the test. ``build_gemma3_processor(tokenizer="gemma")`` (`mmpipe.offline.gemma3`)
puts this one in the Gemma 3 processor.
"""

from __future__ import annotations

import copy
import functools
import json
import tempfile

__all__ = ["GEMMA_SPECIAL_TOKENS", "build_gemma_tokenizer"]

GEMMA_SPECIAL_TOKENS = ("<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>")
_VOCAB_SIZE = 1200  # learned pieces; the corpus holds ~1,400 distinct words
_NAMED = dict(boi_token="<start_of_image>", image_token="<image_soft_token>", eoi_token="<end_of_image>")


@functools.lru_cache(maxsize=None)
def _tokenizer():
    import transformers
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers

    from mmpipe.offline.tokenizer import CORPUS

    learner = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    learner.normalizer = normalizers.Replace(" ", "▁")  # GemmaTokenizer's pipeline, as transformers 5 builds it
    learner.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    reserved = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"<0x{i:02X}>" for i in range(256)]
    learner.train_from_iterator(CORPUS.splitlines(), trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE, special_tokens=reserved, show_progress=False))
    model = json.loads(learner.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = transformers.GemmaTokenizer(vocab=dict(model["vocab"]), merges=merges)
    tok.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True, normalized=False)
                                                          for t in GEMMA_SPECIAL_TOKENS]})
    tok.add_tokens([AddedToken("\n" * k, normalized=False, special=False) for k in (1, 2, 3, 4)])
    with tempfile.TemporaryDirectory() as d:  # the named image tokens (``tok.boi_token_id``...) on reload
        tok.save_pretrained(d)
        return transformers.AutoTokenizer.from_pretrained(d, extra_special_tokens=dict(_NAMED), add_bos_token=True)


def build_gemma_tokenizer():
    """A fresh Gemma-structured tokenizer (module doc; transformers 5: its ``GemmaTokenizer``)."""
    return copy.deepcopy(_tokenizer())
