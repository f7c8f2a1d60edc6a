"""Token-budget batches: a DataLoader ``batch_sampler`` that groups rows by token count.

Every batch stays under a token budget (and an image budget), so a batch of short rows
holds many rows and a batch of long rows few, instead of a fixed row count padded to its
longest row. The lengths come from the encoded columns (``input_ids``, ``image_grid_thw``),
which the layout-only encode (``pixels="none"``: ids, grids and positions from the image
headers, no pixel decode) produces in seconds, before any pixel is stored.

Two costs, matching the two collators:

- ``cost="padded"`` (`mmpipe.Collator`): a batch costs ``rows * longest row`` tokens, the
  size of its padded ``[B, L]`` tensors;
- ``cost="packed"`` (`mmpipe.batching.packing.PackingCollator`): a batch costs the sum of its row
  lengths, the ``[1, T]`` packed sequence.

Each epoch: shuffle the rows (seeded by ``seed + epoch``), cut them into buckets of
``bucket_size`` rows, sort each bucket by length (longest first), fill batches (padded: in
order; packed: first-fit, so short rows fill the gaps long rows leave), then shuffle the
batch order. Every row is in exactly one batch per epoch; nothing is dropped or repeated
(unless ranks cannot get the same number of batches otherwise and ``uneven`` says to).

Resuming: ``state_dict()`` is ``{"epoch", "seed", "consumed_rows", ...}``, where
``consumed_rows`` counts the rows of the epoch's global order that all ranks together have
been handed, the same number on every rank whatever ``num_replicas`` is. A sampler built over
the same rows with the same budgets (any ``num_replicas`` / ``rank``) continues from it after
``load_state_dict``: the same global order, no row repeated or skipped in the epoch. It works
as the ``batch_sampler`` of torchdata's ``StatefulDataLoader`` (worker prefetching included).
A resume on more ranks near an epoch's end can leave fewer rows than ranks: ``uneven="drop"``
or ``"repeat"`` (like ``DistributedSampler(drop_last=True/False)``) continues from the same state.

A row over a budget on its own (longer than ``max_tokens`` or with more than ``max_images``
images) raises at construction by default (``oversize="raise"``: a budget is usually a
memory limit, and such a row would fail later, mid-epoch); ``oversize="alone"`` gives each
such row a batch of its own instead (the only batches allowed over the budget).

Example::

    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": processor}, **mmpipe.map_kwargs(processor, ds))
    sampler = TokenBudgetBatchSampler.from_dataset(enc, max_tokens=16384, max_images=32, seed=0)
    loader = DataLoader(enc, batch_sampler=sampler, collate_fn=mmpipe.Collator(processor))
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch in loader: ...
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Iterator, Optional, Sequence

import numpy as np

from mmpipe.batching.batch_split import batch_costs, split_to_multiple
from mmpipe.batching.token_counts import (  # noqa: F401  (re-exported: their home was here)
    COSTS, count_arg, count_array, token_counts, token_efficiency)
from mmpipe.errors import ArgumentError, InputError, is_integer

logger = logging.getLogger("mmpipe")
OVERSIZE = ("raise", "alone")
UNEVEN = ("raise", "drop", "repeat")


class TokenBudgetBatchSampler:
    """Batches of row indices under a token budget and an image budget.

    Args:
        lengths: int [n] tokens per row (after image expansion).
        num_images: int [n] images per row, or None (no image budget possible then).
        max_tokens: token budget per batch, counted as ``cost`` says.
        max_images: image budget per batch (None: unbounded).
        max_rows: row budget per batch (None: unbounded).
        cost: ``"padded"`` (rows x longest row) or ``"packed"`` (sum of lengths).
        shuffle: shuffle rows and batch order each epoch (``seed + epoch``); without it the
            batches come in a fixed length-grouped order.
        seed: base seed; the same seed and epoch give the same batches.
        bucket_size: rows sorted together (None: the whole epoch). Smaller buckets mix
            lengths more across epochs; larger ones pad (or leave) less.
        oversize: ``"raise"`` or ``"alone"`` for a row over a budget on its own (see module).
        num_replicas, rank: data-parallel sharding. Every rank builds the same epoch (same
            seed), whose global batch order does not depend on the number of ranks, and
            takes its batches in turn (step k: global batches ``k*R .. k*R+R-1``, rank r the
            r-th): each rank gets the same number of batches (batches are split in two, in
            place, never merged, until the count divides evenly), and the ranks' rows
            together are every row exactly once.
        uneven: when the rows left cannot make a multiple of ``num_replicas`` batches (every
            batch down to one row: fewer rows than ranks, or a resume near an epoch's end on
            more ranks): ``"raise"`` (`ArgumentError`), ``"drop"`` the last few rows of the epoch
            (fewer than ``num_replicas``; like ``DistributedSampler(drop_last=True)``) or
            ``"repeat"`` rows from the epoch's start (``drop_last=False``). Not part of the saved
            state: a state saved with one value loads with another.

    Resumable and elastic: `state_dict` / `load_state_dict` save and restore the epoch, the
    seed and the number of rows all ranks have consumed (a prefix of the global order), so a
    resumed sampler, under torchdata's ``StatefulDataLoader`` too, continues exactly, on the
    same or on another number of ranks.

    ``len(sampler)`` is the number of batches of the current epoch on this rank (it can
    change with the epoch when shuffling). Usable as ``DataLoader(ds, batch_sampler=sampler, ...)``.
    """

    def __init__(self, lengths: Sequence[int], num_images: Optional[Sequence[int]] = None, *, max_tokens: int,
                 max_images: Optional[int] = None, max_rows: Optional[int] = None, cost: str = "padded",
                 shuffle: bool = True, seed: int = 0, bucket_size: Optional[int] = 2048, oversize: str = "raise",
                 num_replicas: int = 1, rank: int = 0, uneven: str = "raise"):
        who = "TokenBudgetBatchSampler"
        self.lengths = count_array(who, "lengths", lengths)
        n = self.lengths.shape[0]
        self.num_images = np.zeros(n, np.int64) if num_images is None else count_array(who, "num_images", num_images)
        if self.num_images.shape[0] != n:
            raise ArgumentError(f"num_images has {self.num_images.shape[0]} entries but lengths has {n}; give one per row")
        if cost not in COSTS:
            raise ArgumentError(f"cost must be one of {COSTS}, got {cost!r}")
        if oversize not in OVERSIZE:
            raise ArgumentError(f"oversize must be one of {OVERSIZE}, got {oversize!r}")
        if uneven not in UNEVEN:
            raise ArgumentError(f"uneven must be one of {UNEVEN}, got {uneven!r}")
        max_tokens = count_arg(who, "max_tokens", max_tokens, 1, none_ok=False, example=16384)
        max_images, max_rows = count_arg(who, "max_images", max_images, 0), count_arg(who, "max_rows", max_rows, 1)
        bucket_size = count_arg(who, "bucket_size", bucket_size, 1)
        seed = count_arg(who, "seed", seed, 0, none_ok=False, example=0)
        num_replicas = count_arg(who, "num_replicas", num_replicas, 1, none_ok=False, example=1)
        if not is_integer(rank) or not 0 <= rank < num_replicas:
            raise ArgumentError(f"need num_replicas >= 1 and 0 <= rank < num_replicas, got num_replicas={num_replicas}, "
                                f"rank={rank}")
        if n and (self.lengths.min() < 0 or self.num_images.min() < 0):
            raise ArgumentError(f"lengths and num_images must be >= 0, got min length {int(self.lengths.min())}, "
                                f"min images {int(self.num_images.min())}")
        if max_images is not None and num_images is None:
            raise ArgumentError("max_images needs num_images (images per row); pass both or neither")
        self.max_tokens, self.max_images, self.max_rows = int(max_tokens), max_images, max_rows
        self.cost, self.shuffle, self.seed = cost, shuffle, int(seed)
        self.bucket_size, self.oversize, self.uneven = bucket_size, oversize, uneven
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        over = self.lengths > self.max_tokens
        if max_images is not None:
            over |= self.num_images > max_images
        self.oversized = np.flatnonzero(over)
        if len(self.oversized) and oversize == "raise":
            i = int(self.oversized[0])
            raise InputError(
                f"row {i} is over the batch budget on its own: {int(self.lengths[i])} tokens (max_tokens="
                f"{self.max_tokens}), {int(self.num_images[i])} images (max_images={max_images}); "
                f"{len(self.oversized)} row(s) in all, e.g. {self.oversized[:5].tolist()}", where="", row=i,
                column="input_ids", stage="collate",
                expected=f"at most {self.max_tokens} tokens" + (f" and {max_images} images" if max_images is not None
                                                               else ""),
                found=f"{int(self.lengths[i])} tokens, {int(self.num_images[i])} images",
                fix="raise the budget, drop or truncate them at encode time (max_length=..., truncation='drop'), "
                    "or pass oversize='alone' to give each its own batch",
            )
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None
        self._resume: Optional[int] = None  # global rows consumed, from load_state_dict
        self._live = 0  # global rows consumed by the current iteration
        self._planned: tuple | None = None  # ((epoch, start, seed), this rank's plan)
        self._asked: Optional[int] = None  # set_epoch's epoch until the next iteration hands out a batch
        if n == 0:  # valid, an empty epoch (as torch's BatchSampler gives), but 0 steps are rarely meant
            logger.warning("TokenBudgetBatchSampler over 0 rows: every epoch is empty (a filter or drop left none?)")

    # ---- construction from data -----------------------------------------------------
    @classmethod
    def from_dataset(cls, dataset, **kwargs) -> "TokenBudgetBatchSampler":
        """From an encoded map-style ``datasets.Dataset`` (any pixel storage, layout-only
        included; `token_counts`). ``max_images`` needs the rows' image counts: a dataset
        without a column that says them (generic-path rows of an earlier mmpipe, no
        ``image_hw``) raises `ArgumentError` then, never a silent 0 images per row."""
        lengths, num_images = token_counts(dataset)
        if num_images is None and kwargs.get("max_images") is not None:
            raise ArgumentError(
                "max_images needs each row's image count, and this dataset has no column that says it "
                "(image_grid_thw, tiles_per_image or image_hw; generic-path rows of an earlier mmpipe store no "
                "image_hw): re-encode it with mmpipe.encode (which stores image_hw), or leave max_images out, or "
                "pass TokenBudgetBatchSampler(lengths, num_images, ...) with counts you know")
        return cls(lengths, num_images, **kwargs)

    # ---- epochs ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Use the batches of ``epoch`` (shuffled with ``seed + epoch``). The same epoch as a
        loaded state keeps its position; another one starts at its beginning."""
        epoch = count_arg("TokenBudgetBatchSampler.set_epoch", "epoch", epoch, 0, none_ok=False, example=0)
        if epoch != self.epoch:
            self._resume, self._live = None, 0
        self.epoch = self._asked = int(epoch)

    def batches(self, epoch: Optional[int] = None) -> list[list[int]]:
        """This rank's batches (lists of row indices) of ``epoch`` (default: the current one),
        the whole epoch (from its start, whatever state was loaded)."""
        epoch = self.epoch if epoch is None else int(epoch)
        return [b for b, _ in self._plan(epoch, 0)]

    def global_batches(self, epoch: Optional[int] = None) -> list[list[int]]:
        """The epoch's global batch order, the same for every number of ranks: ranks take its
        batches in turn (split where the count does not divide; see `state_dict`)."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self._build(epoch))
        return self._cache[1]

    def __iter__(self) -> Iterator[list[int]]:
        # eager (not a generator function): the position is known as soon as iter() returns,
        # which is when StatefulDataLoader may ask for state_dict
        epoch = self.epoch
        start = self._resume if self._resume is not None else 0
        plan = self._plan(epoch, start)
        self._live = start
        return self._walk(plan)

    def _walk(self, plan: list[tuple[list[int], int]]) -> Iterator[list[int]]:
        self._asked = self._resume = None  # at the 1st batch: iter() runs before a load, twice with workers
        for batch, after in plan:  # a batch counts as consumed once handed out
            self._live = after
            yield list(batch)

    def __len__(self) -> int:
        """This rank's batches in the next iteration (the rest of the epoch after a resume)."""
        return len(self._plan(self.epoch, self._resume or 0))

    # ---- resumable, elastic ---------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"epoch", "seed", "consumed_rows", ...}``: ``consumed_rows`` counts the rows handed out
        by *all* ranks together, a prefix of the epoch's global row order (`global_batches`), the
        same on every rank after the same steps, whatever ``num_replicas``. Batches count when
        handed out (``StatefulDataLoader`` itself accounts for those its workers prefetch)."""
        return {"version": 1, "epoch": self.epoch, "seed": self.seed,
                "consumed_rows": int(self._live if self._resume is None else self._resume),
                "num_rows": int(self.lengths.shape[0]), "config": self._config()}

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict` (of this or any rank, of any ``num_replicas``): the next
        iteration starts after the rows already consumed in that epoch. Epoch and seed come
        from the state; the rows and budgets must be the ones it was saved with. After an epoch's
        last batch, a ``set_epoch`` made before the load (``StatefulDataLoader`` loads at ``iter()``)
        wins: that epoch, whole. Mid-epoch, another epoch is an `ArgumentError`."""
        keys = ("epoch", "seed", "consumed_rows", "num_rows", "config")
        missing = list(keys) if not isinstance(state, Mapping) else [k for k in keys if k not in state]
        if missing:
            raise ArgumentError(f"not a TokenBudgetBatchSampler state: missing {missing}; pass sampler.state_dict()")
        n, saved = int(self.lengths.shape[0]), state["config"] if isinstance(state["config"], Mapping) else {}
        if state["num_rows"] != n or saved != self._config():
            diff = {k: (saved.get(k), v) for k, v in self._config().items() if saved.get(k) != v}
            raise ArgumentError(
                f"the state was saved by a sampler over other rows or budgets (saved num_rows={state['num_rows']}, "
                f"here {n}; differing settings as (saved, here): {diff}); the global order would differ, so "
                "resuming could repeat or skip rows: build the sampler with the same lengths and settings "
                "(num_replicas and rank may change)"
            )
        who = "TokenBudgetBatchSampler.load_state_dict"
        consumed = count_arg(who, "consumed_rows", state["consumed_rows"], 0, none_ok=False)
        if consumed > n:
            raise ArgumentError(f"{who}: consumed_rows must be in 0..{n}, got {consumed}; pass sampler.state_dict()")
        epoch = count_arg(who, "epoch", state["epoch"], 0, none_ok=False)
        if self._asked not in (None, epoch) and consumed < n:
            raise ArgumentError(
                f"{who}: the state stopped {consumed} rows into epoch {epoch} (of {n} rows), but set_epoch("
                f"{self._asked}) came before it loaded (StatefulDataLoader loads it at the first iter()); that would "
                f"skip or repeat rows: call sampler.set_epoch({epoch}) to finish the saved epoch first")
        self.seed = count_arg(who, "seed", state["seed"], 0, none_ok=False)
        self._cache = self._planned = None
        keep = self._asked in (None, epoch)  # else the saved epoch is over: set_epoch's epoch, from its start
        self.epoch, self._resume, self._live = (int(epoch), consumed, consumed) if keep else (self.epoch, None, 0)

    def _config(self) -> dict:
        digest = hashlib.sha256(self.lengths.tobytes() + b"|" + self.num_images.tobytes()).hexdigest()[:16]
        return {"max_tokens": self.max_tokens, "max_images": self.max_images, "max_rows": self.max_rows,
                "cost": self.cost, "shuffle": self.shuffle, "bucket_size": self.bucket_size,
                "oversize": self.oversize, "lengths_sha256": digest}

    def _plan(self, epoch: int, start: int) -> list[tuple[list[int], int]]:
        """This rank's ``(batch, consumed_rows after its step)`` from global row ``start`` on."""
        if self._planned is not None and self._planned[0] == (epoch, start, self.seed):
            return self._planned[1]
        units, R = self._remaining(self.global_batches(epoch), start), self.num_replicas
        units = self._split_to_multiple(units, R, epoch, start) if R > 1 else units
        out, done = [], start
        for s in range(0, len(units), R):
            done += sum(len(b) for b in units[s:s + R])
            out.append((units[s + self.rank], done))
        if out:  # the last step ends the epoch (rows uneven="repeat" added or "drop" left out included)
            out[-1] = (out[-1][0], int(self.lengths.shape[0]))
        self._planned = ((epoch, start, self.seed), out)
        return out

    @staticmethod
    def _remaining(batches: list[list[int]], start: int) -> list[list[int]]:
        """The global order after its first ``start`` rows: the rest of a batch a resume cut
        (a subset of a batch is under every budget too), then the whole batches."""
        seen = 0
        for j, b in enumerate(batches):
            if seen + len(b) > start:
                return [list(b[start - seen:])] + [list(x) for x in batches[j + 1:]]
            seen += len(b)
        return []

    # ---- the work -------------------------------------------------------------------
    def _build(self, epoch: int) -> list[list[int]]:
        n = self.lengths.shape[0]
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        order = rng.permutation(n) if rng is not None else np.arange(n)
        alone = np.zeros(n, bool)
        alone[self.oversized] = True
        batches: list[list[int]] = [[int(i)] for i in order[alone[order]]]
        order = order[~alone[order]]
        step = self.bucket_size or max(n, 1)
        for s in range(0, len(order), step):
            bucket = order[s:s + step]
            # longest first; stable, so equal lengths keep the shuffled order
            bucket = bucket[np.argsort(-self.lengths[bucket], kind="stable")]
            batches += self._fill_padded(bucket) if self.cost == "padded" else self._fill_packed(bucket)
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _cost(self, batch: list[int]) -> int:
        L = self.lengths[batch]
        return int(L.sum()) if self.cost == "packed" else len(batch) * int(L.max())

    def _split_to_multiple(self, batches: list[list[int]], R: int, epoch: int, start: int) -> list[list[int]]:
        """Split batches in place (the two halves side by side, so the global row order is
        kept) until their count is a multiple of ``R``: every rank gets the same number. When
        every batch is down to one row, ``uneven`` says what happens (`_uneven_tail`)."""
        # the batch with the most rows first (ties: highest cost, then first in order); splitting
        # keeps both halves under every budget (costs only shrink). A heap, not a rescan per split
        out, even = split_to_multiple(batches, R, self._cost, batch_costs(batches, self.lengths, self.cost))
        return out if even else self._uneven_tail(out, R, epoch, start)

    def _uneven_tail(self, units: list[list[int]], R: int, epoch: int, start: int) -> list[list[int]]:
        """One-row ``units`` whose count is not a multiple of ``R``, made one as ``uneven`` says:
        the last rows dropped, rows from the epoch's start repeated, or `ArgumentError`."""
        extra = len(units) % R
        if self.uneven == "drop":
            return units[: len(units) - extra]
        if self.uneven == "repeat":
            order = [i for b in self.global_batches(epoch) for i in b]
            return units + [[order[j % len(order)]] for j in range(R - extra)]
        n = int(self.lengths.shape[0])
        raise ArgumentError(
            f"cannot give each of {R} ranks the same number of batches: the epoch's remaining {len(units)} rows "
            + (f"(resumed after {start} of its {n} rows) " if start else "")
            + f"make {len(units)} batches of one row each (not a multiple of {R}) and a row is never split or "
            f"repeated; pass uneven='drop' (leave the epoch's last {extra} row(s) out, like "
            f"DistributedSampler(drop_last=True)) or uneven='repeat' (repeat {R - extra} row(s) from the epoch's "
            "start, like drop_last=False): a saved state loads into a sampler with either"
            + ("" if start else "; or use more rows per epoch, fewer ranks, or a larger max_tokens"))

    def _fits_rows_images(self, rows: int, images: int) -> bool:
        return ((self.max_rows is None or rows <= self.max_rows)
                and (self.max_images is None or images <= self.max_images))

    def _fill_padded(self, bucket: np.ndarray) -> list[list[int]]:
        out, cur, longest, imgs = [], [], 0, 0
        for i in bucket.tolist():
            L, k = int(self.lengths[i]), int(self.num_images[i])
            new_longest = max(longest, L)
            if cur and not ((len(cur) + 1) * new_longest <= self.max_tokens
                            and self._fits_rows_images(len(cur) + 1, imgs + k)):
                out.append(cur)
                cur, new_longest, imgs = [], L, 0
            cur.append(i)
            longest, imgs = new_longest, imgs + k
        if cur:
            out.append(cur)
        return out

    def _fill_packed(self, bucket: np.ndarray) -> list[list[int]]:
        """First-fit decreasing (the bucket is sorted longest first): each row into the first batch
        with room, found in a max-tree over the batches' free tokens and images: O(log n) a row, not
        a scan of the open batches (hours at 10^6 rows, bucket_size=None). Leaves are batches."""
        size = 1 << max(len(bucket) - 1, 0).bit_length()  # leaves >= rows >= batches
        img_cap = int(self.num_images[bucket].sum()) if self.max_images is None else self.max_images
        free_tok, free_img = [self.max_tokens] * (2 * size), [img_cap] * (2 * size)
        bins: list[list[int]] = [[] for _ in range(size)]  # unused leaves: empty batches, room for any row
        for i in bucket.tolist():
            L, k = int(self.lengths[i]), int(self.num_images[i])
            node = 1  # depth-first, left to right, skipping subtrees where no batch has room
            while node < size or free_tok[node] < L or free_img[node] < k:
                if free_tok[node] >= L and free_img[node] >= k:
                    node *= 2
                    continue
                while node & 1:  # a right child without room: its parent's subtree has none left
                    node >>= 1
                node += 1
            bins[node - size].append(i)
            free_tok[node], free_img[node] = free_tok[node] - L, free_img[node] - k
            if self.max_rows is not None and len(bins[node - size]) >= self.max_rows:
                free_tok[node] = -1  # full: takes no row
            while node > 1:
                node >>= 1
                free_tok[node] = max(free_tok[2 * node], free_tok[2 * node + 1])
                free_img[node] = max(free_img[2 * node], free_img[2 * node + 1])
        return [b for b in bins if b]  # the used leaves come first

    def __repr__(self) -> str:
        return (f"TokenBudgetBatchSampler(rows={len(self.lengths)}, max_tokens={self.max_tokens}, "
                f"max_images={self.max_images}, cost={self.cost!r}, shuffle={self.shuffle}, seed={self.seed}, "
                f"epoch={self.epoch}, rank={self.rank}/{self.num_replicas})")

