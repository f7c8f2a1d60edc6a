"""cosmos-rl's side of mmpipe's data packers (`mmpipe.rollout.packers`): its ``BaseDataPacker``
(resolved on first use, None without cosmos-rl) and registration, and what its trainers hand a
packer beyond one prompt item: a dataset item its multi-turn rollout grows in place (`item_shape`,
the prompt cache's key), a multi-turn rollout's completed conversation (`completed_conversation`),
the collate length it asks for (`check_fits`), what a packer refuses to make a prompt of
(`refuse_skips`, `stored_item`, `check_prompt`), and the packers' bounded prompt cache (`PromptCache`)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Optional, Sequence

from mmpipe._fork import ForkSafeLock
from mmpipe.records.row import MultiModalInputs

__all__ = ["PromptCache", "built_once", "check_fits", "check_prompt", "completed_conversation", "cosmos_base_packer",
           "encoded_sft_row", "item_shape", "refuse_skips", "register_with_cosmos", "stored_item"]


def cosmos_base_packer() -> Optional[type]:
    """cosmos-rl's ``BaseDataPacker``, or None when cosmos-rl is not installed."""
    try:
        from cosmos_rl.dispatcher.data.packer.base import BaseDataPacker
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "cosmos_rl":
            return None
        raise
    return BaseDataPacker


_BUILT: dict = {}  # name -> the packer class built for it in this process
# threads racing the first use each built a class (lru_cache does not lock its misses): an instance of a
# losing one is no QwenVLDataPacker for isinstance, and pickle refuses it ("not the same object")
_BUILT_LOCK = ForkSafeLock(reentrant=True)


def built_once(name: str, build) -> type:
    """The class ``build()`` made for ``name``, built once per process however many threads ask."""
    with _BUILT_LOCK:
        cls = _BUILT.get(name)
        if cls is None:
            cls = _BUILT[name] = build()
        return cls


def register_with_cosmos(cls: type, model_types: Sequence[str], *, allow_override: bool = True) -> None:
    """Make cosmos-rl's ``BaseDataPacker.get_default_data_packer(model_type)`` build ``cls``."""
    base = cosmos_base_packer()
    if base is None:
        raise ModuleNotFoundError("register_with_cosmos needs cosmos-rl: pip install cosmos-rl", name="cosmos_rl")
    base.register(list(model_types), cls, allow_override=allow_override)


def item_shape(item: Any) -> Any:
    """What an in-place edit of a dataset item changes: its messages' identities. Why: cosmos-rl's
    multi-turn rollout calls ``get_rollout_input`` each turn on ONE conversation list that
    ``extend_conversation`` grows in place (``messages += [...]``); an identity-only cache hit
    gave every turn the first turn's prompt (the model never saw its reply or the tool result)."""
    if isinstance(item, (list, tuple)):
        return tuple(map(id, item))
    if isinstance(item, dict):
        msgs = item.get("messages")
        return tuple((k, id(v)) for k, v in item.items()) + (
            (tuple(map(id, msgs)),) if isinstance(msgs, (list, tuple)) else ())
    return None


def completed_conversation(packer, sample: Any) -> Optional[list]:
    """The messages of a multi-turn rollout's completed conversation, else None.

    With ``rollout.multi_turn_config.enable`` cosmos-rl's trainer passes
    ``rollout.completed_conversation`` (the dialogue WITH the last reply, appended by
    ``extend_conversation``) and the last reply's ids. Why: taken as a prompt, that reply
    would sit in the row twice (as text, then as the sampled ids) and only the copy would be
    scored. Here the row is the conversation up to the last reply (its generation prompt
    added), then the sampled ids, every assistant turn labelled (cosmos-rl's own multi-turn
    packer scores all of them)."""
    mt = getattr(getattr(getattr(packer, "config", None), "rollout", None), "multi_turn_config", None)
    if not getattr(mt, "enable", False) or not isinstance(sample, (list, tuple)) or not sample:
        return None
    messages = packer.to_row(sample)["messages"]
    last = messages[-1]
    return messages if isinstance(last, dict) and last.get("role") == "assistant" and len(messages) > 1 else None


def check_fits(packer, rows: Sequence[MultiModalInputs], max_len: int) -> None:
    """A row longer than ``max_len`` raises `TruncationError` naming cosmos-rl's setting. Why:
    cosmos-rl asks for ``min(policy.model_max_length, sft_compute_max_len)`` in SFT (and
    ``model_max_length`` under pipeline parallelism) and its own packers cut longer rows
    silently (an image's tokens with them); mmpipe never cuts a row."""
    from mmpipe.errors import TruncationError

    for b, r in enumerate(rows):
        n = r.num_tokens if isinstance(r, MultiModalInputs) else None
        if n is not None and n > max_len:
            limit = getattr(getattr(getattr(packer, "config", None), "policy", None), "model_max_length", None)
            raise TruncationError(
                "the sample does not fit the length cosmos-rl asked the collate for", row=b, column="input_ids",
                stage="collate", expected=f"at most computed_max_len={max_len} tokens"
                + (f" (policy.model_max_length={limit})" if limit is not None else ""), found=f"{n} tokens",
                fix=f"raise policy.model_max_length to at least {n}, or bound the samples when they are made "
                    f"({type(packer).__name__}(max_length=..., truncation='truncate_text'), or mmpipe.encode_dataset("
                    "..., max_length=N, truncation='drop') before cosmos-rl reads the dataset)")


def refuse_skips(packer, options: Mapping) -> None:
    """`ArgumentError` for the encode options that leave a row out (``truncation="drop"``,
    ``on_error="skip"``). Why: cosmos-rl asks a packer for one prompt / policy row per dataset item and
    has nothing to take a skipped one; ``truncation="drop"`` escaped as the encoder's internal
    `RowDropped` signal, and ``on_error="skip"`` was silently not applied (every failure raised)."""
    from mmpipe.errors import ArgumentError

    given = [f"{k}={options[k]!r}" for k, v in (("truncation", "drop"), ("on_error", "skip")) if options.get(k) == v]
    if given:
        raise ArgumentError(
            f"{type(packer).__name__}({', '.join(given)}): a data packer makes one prompt (and one policy row) "
            "for every dataset item cosmos-rl hands it and cannot leave one out. Filter the dataset before "
            "cosmos-rl reads it (encode it with mmpipe.encode_dataset(..., max_length=N, truncation='drop', "
            "on_error='skip'), which drops and reports those rows, and give the packer the encoded rows), or "
            "use truncation='truncate_text' / the default 'raise'")


def stored_item(item: Any, what: str) -> Optional[MultiModalInputs]:
    """A dataset item that is an encoded row as stored (a dict with ``family`` and ``input_ids``:
    ``enc[i]`` of a dataset mapped with `mmpipe.encode`) -> its record; None for any other item.
    A row that failed to encode under ``on_error="skip"`` (0 tokens, its failure in
    `ERROR_COLUMN`) raises the `InputError` the other readers of stored rows raise (its dataset
    row, column ``mmpipe_error``, the fix): as a prompt it became an empty one, silently."""
    from mmpipe.records.columns import ERROR_COLUMN

    if not (isinstance(item, Mapping) and "family" in item and "input_ids" in item):
        return None
    failure = item.get(ERROR_COLUMN)
    if failure:
        try:
            row = json.loads(failure).get("row")
        except (ValueError, AttributeError):
            row = None
        from mmpipe.errors import InputError

        raise InputError(
            f"the dataset item given to {what} is a row that failed to encode ({failure})", row=row if isinstance(row, int)
            else None, where=None if isinstance(row, int) else "the dataset item", column=ERROR_COLUMN,
            stage="rollout", expected="an encoded row (an empty mmpipe_error)", found="a failed row (0 tokens)",
            fix="filter failed rows out of the dataset before cosmos-rl reads it: ds, errors = "
                "mmpipe.drop_failed(ds), or encode with mmpipe.encode_dataset")
    return MultiModalInputs.from_dict(item)


def check_prompt(row: MultiModalInputs, what: str) -> MultiModalInputs:
    """``row`` (an encoded prompt), refused when it holds no token: what a row that failed to encode
    under ``on_error="skip"`` reads as (``MultiModalInputs.from_dict`` keeps no failure), which went
    to the rollout as an empty prompt and to the policy as a row of response tokens alone."""
    from mmpipe.rollout.inputs import refuse_empty_prompt

    return refuse_empty_prompt(row, f"the encoded prompt given to {what} holds no token", where="the dataset item",
                               more_fix="; or give the packer the raw item (chat list / row dict)")


def encoded_sft_row(sample: Any) -> Optional[MultiModalInputs]:
    """An SFT item that is an encoded row (a record, or a stored dict: `stored_item`), checked as
    `check_prompt` checks a prompt and refused without labels; None for any other item."""
    row = sample if isinstance(sample, MultiModalInputs) else stored_item(sample, "sft_process_sample")
    if row is not None and check_prompt(row, "sft_process_sample").labels is None:
        from mmpipe.errors import ArgumentError

        raise ArgumentError("sft_process_sample: the encoded row carries no labels (encoded with labels=False); "
                            "encode SFT rows with labels=True (the default)")
    return row


class PromptCache:
    """Encoded prompts by item identity (an item edited in place misses: `item_shape`), least
    recently used first out, bounded by entries AND bytes (the rows' arrays plus the images the
    items hold, which the cache keeps alive). Why bytes: cosmos-rl's policy side gets each
    rollout's item deserialized anew, so nothing there ever hits, and 4,096 entries of real
    photos (encoded row + decoded item images, MBs each) kept GBs alive for the whole run."""

    MAX_ENTRIES = 4096
    MAX_BYTES = 256 << 20

    def __init__(self):
        self._entries: OrderedDict = OrderedDict()  # id(item) -> (item, row, shape, bytes)
        self._bytes = 0
        # one packer serves concurrent calls (threaded rollout servers): a hit's move_to_end raced
        # another call's eviction (a bare KeyError) and the byte count lost updates
        self._lock = threading.Lock()

    def get(self, item: Any) -> Optional[MultiModalInputs]:
        shape = item_shape(item)
        with self._lock:
            hit = self._entries.get(id(item))
            if hit is None or hit[0] is not item or hit[2] != shape:
                return None
            self._entries.move_to_end(id(item))
            return hit[1]

    def put(self, item: Any, row: MultiModalInputs) -> None:
        entry = (item, row, item_shape(item), _nbytes(row) + _nbytes(item))
        with self._lock:
            old = self._entries.pop(id(item), None)
            self._bytes -= old[3] if old is not None else 0
            self._entries[id(item)] = entry
            self._bytes += entry[3]
            while len(self._entries) > self.MAX_ENTRIES or (self._bytes > self.MAX_BYTES and len(self._entries) > 1):
                self._bytes -= self._entries.popitem(last=False)[1][3]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __getstate__(self) -> dict:  # a pickled packer (Ray, cosmos-rl workers): entries are by id, this process's
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def __len__(self) -> int:
        return len(self._entries)


def _nbytes(value: Any, depth: int = 0) -> int:
    """Bytes of the arrays, images, byte strings and strings (base64 images) in a row or a dataset
    item (nested lists and dicts, a few levels)."""
    if hasattr(value, "nbytes"):
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if hasattr(value, "getbands") and hasattr(value, "size"):  # a PIL image, decoded
        return value.size[0] * value.size[1] * len(value.getbands())
    if depth > 4:
        return 0
    if isinstance(value, dict):
        return sum(_nbytes(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v, depth + 1) for v in value)
    if isinstance(value, MultiModalInputs):
        return sum(_nbytes(v, depth + 1) for v in vars(value).values())
    return 0
