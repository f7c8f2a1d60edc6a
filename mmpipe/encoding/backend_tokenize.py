"""One tokenizer call over a batch of texts, read from the ``tokenizers`` backend (the batched
layout path, `mmpipe.encoding.layout_batch`): the ids and, for labels, each token's character
offsets, equal to ``tok(texts, add_special_tokens=False, return_offsets_mapping=...)``.

Offsets without the tokenizer's offset tracking: for a byte-level BPE tokenizer every token is
a run of the text's UTF-8 bytes, so its byte length is a property of its id (the vocabulary
string's length: one character per byte; an added token's content in UTF-8) and the offsets are
the running sum of those lengths, mapped from bytes to characters (a token holding part of a
character covers that whole character, as the tokenizer reports it). That holds when nothing
between the text and the tokens changes the characters or their order (`_ByteTable.of` checks
the backend: no normalizer or NFC on NFC text, only ``Split`` / ``ByteLevel`` pre-tokenizers
without a prefix space, a BPE model without byte fallback, no added token that strips
whitespace, no post-processor that trims offsets), and each row is checked when it is used: its
tokens' byte lengths sum to its UTF-8 length. The first batch per tokenizer, and its first batch
with non-ASCII text, are also tokenized with offset tracking and compared; a difference turns
the shortcut off for that tokenizer. The shortcut saves the tracking: ~1.5 ms of ~3.6 per 30
chat rows (`encode_batch_fast` + the sums vs `encode_batch` + its offset lists).
"""

from __future__ import annotations

import itertools
import json
import unicodedata
from typing import Optional

import numpy as np

__all__ = ["backend_encode", "offset_array"]


def backend_encode(tok, texts: list, offsets: bool) -> Optional[tuple]:
    """``(ids, offsets)``: what ``tok(texts, add_special_tokens=False,
    return_offsets_mapping=offsets)`` returns, ids as lists of int, offsets one int64 [n, 2]
    array per text (None without ``offsets``), read from the ``tokenizers`` backend:
    ``encode_batch_fast`` (no offset tracking) and, for offsets, the byte-length sums (module
    doc) or ``encode_batch``; or None where the call might differ: a tokenizer class that is not
    transformers' plain ``tokenizers``-backed one, a backend with truncation, padding or another
    special-token split than the tokenizer's, or a text over ``model_max_length`` (the call logs
    its warning)."""
    backend = _plain_backend(tok)
    if backend is None:
        return None
    table = _ByteTable.of(backend) if offsets else None
    if offsets and table is None:
        encs = backend.encode_batch(texts, add_special_tokens=False)
        ids, offs = [e.ids for e in encs], [offset_array(e.offsets) for e in encs]
    else:
        ids = [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
        offs = table.offsets(backend, texts, ids) if offsets else None
    limit = getattr(tok, "model_max_length", None)
    return None if limit is not None and any(len(x) > limit for x in ids) else (ids, offs)


def _plain_backend(tok):
    """The ``tokenizers`` backend of a transformers tokenizer whose call is the backend's batch
    call and nothing more; None otherwise (transformers 4.x too: its own path)."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    backend = getattr(tok, "backend_tokenizer", None)
    cls = type(tok)
    if (not isinstance(tok, TokenizersBackend) or cls._encode_plus is not TokenizersBackend._encode_plus
            or cls.__call__ is not PreTrainedTokenizerBase.__call__ or hasattr(tok, "_switch_to_input_mode")
            or not hasattr(backend, "encode_batch_fast") or backend.truncation is not None
            or backend.padding is not None or backend.encode_special_tokens != bool(tok.split_special_tokens)):
        return None
    return backend


def offset_array(offsets: list) -> np.ndarray:
    """A tokenizer's own offsets of one text (a list of (start, end) pairs) as int64 [n, 2]."""
    return np.fromiter(itertools.chain.from_iterable(offsets), np.int64, 2 * len(offsets)).reshape(-1, 2)


def _state(component) -> dict:
    """A backend component's settings (its serialised form), {} for none."""
    return {} if component is None else json.loads(component.__getstate__())


class _ByteTable:
    """Each id's byte length for one backend (module doc), and whether it has been checked
    against the tokenizer's offset tracking (on ASCII text, on other text)."""

    # id(backend) -> (backend, its vocabulary size, table or None); the backend kept so its id stays
    # its own, the size so that tokens added later build a new table
    _cache: dict = {}

    def __init__(self, lengths: np.ndarray, nfc: bool):
        self.lengths, self.nfc, self.checked = lengths, nfc, set()

    @classmethod
    def of(cls, backend) -> Optional["_ByteTable"]:
        hit, size = cls._cache.get(id(backend)), backend.get_vocab_size(with_added_tokens=True)
        if hit is None or hit[0] is not backend or hit[1] != size:
            if len(cls._cache) >= 8:
                cls._cache.clear()
            hit = cls._cache[id(backend)] = (backend, size, cls._build(backend, size))
        return hit[2]

    @classmethod
    def _build(cls, backend, size: int) -> Optional["_ByteTable"]:
        """The table (``size``: the vocabulary's, added tokens included), or None where the backend
        could move characters (module doc)."""
        try:
            norm, pre, post = (_state(c) for c in (backend.normalizer, backend.pre_tokenizer, backend.post_processor))
            pres = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
            posts = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
            model = backend.model
            if (norm.get("type") not in (None, "NFC") or type(model).__name__ != "BPE"
                    or getattr(model, "byte_fallback", False)
                    or not any(p.get("type") == "ByteLevel" for p in pres)
                    or any(p.get("type") not in ("Split", "ByteLevel") or p.get("add_prefix_space") for p in pres)
                    or any(p.get("type") not in (None, "TemplateProcessing", "ByteLevel")
                           or p.get("trim_offsets") for p in posts)):
                return None
            lengths = np.zeros(size, np.int64)
            for token, i in backend.get_vocab(with_added_tokens=False).items():
                lengths[i] = len(token)  # byte-level: one character per byte
            for i, added in backend.get_added_tokens_decoder().items():
                n = len(added.content.encode("utf-8"))
                if added.lstrip or added.rstrip or added.single_word or not n or i >= size \
                        or (lengths[i] and lengths[i] != n):
                    return None
                lengths[i] = n
        except Exception:  # noqa: BLE001 - an unexpected backend: track offsets
            return None
        return cls(lengths, norm.get("type") == "NFC")

    def offsets(self, backend, texts: list, ids: list) -> list:
        """Each text's offsets int64 [n, 2] from its ids (``encode_batch_fast``'s), or the tracked
        ones where a text does not pass the checks (module doc)."""
        ascii_ = [t.isascii() for t in texts]
        out = self.rows(texts, ids, ascii_)
        check = {"ascii" if a else "other" for a in ascii_} - self.checked
        bad = [i for i, o in enumerate(out) if o is None]
        if check or bad:
            tracked = backend.encode_batch(texts, add_special_tokens=False)
            for kind in check:
                rows = [i for i, a in enumerate(ascii_) if a == (kind == "ascii") and out[i] is not None]
                if not rows:
                    continue  # nothing of that kind computed here: checked with a later batch
                if all(np.array_equal(out[i], offset_array(tracked[i].offsets)) for i in rows):
                    self.checked.add(kind)
                else:  # never again for this backend (its ids agree: they are the same call's)
                    _ByteTable._cache[id(backend)] = (backend, backend.get_vocab_size(with_added_tokens=True), None)
                    return [offset_array(e.offsets) for e in tracked]
            for i in bad:
                out[i] = offset_array(tracked[i].offsets)
        return out

    def rows(self, texts: list, ids: list, ascii_: list) -> list:
        """Each text's offsets int64 [n, 2] from its ids, one pass over the batch (views of one
        array), or None for a text that fails a check: the normalizer would change it, an id has
        no known bytes, or its tokens' bytes do not add up to its UTF-8 length. ``ascii_``: each
        text's ``isascii()``."""
        counts = np.fromiter(map(len, ids), np.int64, len(ids))
        size = self.lengths[np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(counts.sum()))]
        cut = np.concatenate([[0], np.cumsum(counts)])  # each text's tokens: [cut[i], cut[i + 1])
        total = np.concatenate([[0], np.cumsum(size)])  # bytes before each token
        end = total[1:] - np.repeat(total[cut[:-1]], counts)  # each token's end in its own text
        start = end - size
        known = np.concatenate([[0], np.cumsum(size == 0)])  # ids of no known bytes before each token
        nbytes, unknown = (total[cut[1:]] - total[cut[:-1]]).tolist(), (known[cut[1:]] - known[cut[:-1]]).tolist()
        both = np.stack([start, end], axis=1)
        out = []
        for text, plain, a, b, n, z in zip(texts, ascii_, cut[:-1].tolist(), cut[1:].tolist(), nbytes, unknown):
            data = text if plain else text.encode("utf-8")
            if z or n != len(data) or (self.nfc and not plain and not unicodedata.is_normalized("NFC", text)):
                out.append(None)
                continue
            row = both[a:b]
            if not plain:  # byte -> the character holding it
                char = np.cumsum((np.frombuffer(data, np.uint8) & 0xC0) != 0x80) - 1
                row[:, 1] -= 1
                row[:] = char[row]
                row[:, 1] += 1
            out.append(row)
        return out
