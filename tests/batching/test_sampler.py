"""Token-budget batches: every row exactly once per epoch, both budgets kept, deterministic
per (seed, epoch), and usable as a DataLoader ``batch_sampler`` with the collators."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mmpipe
from mmpipe.testing.invariants import assert_roundtrip
from mmpipe.batching.sampler import TokenBudgetBatchSampler, token_counts, token_efficiency

from conftest import processor_for
from strategies import token_budget_cases


def _cost(lengths, batch, cost):
    L = lengths[batch]
    return int(L.sum()) if cost == "packed" else len(batch) * int(L.max())


@settings(max_examples=150, deadline=None)
@given(token_budget_cases())
def test_every_row_once_and_budgets_kept(case):
    lengths, num_images, kw = case
    s = TokenBudgetBatchSampler(lengths, num_images, **kw)
    lengths, num_images = np.asarray(lengths, np.int64), np.asarray(num_images, np.int64)
    over = set(s.oversized.tolist())
    for epoch in (0, 1):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(s) == len(batches)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(len(lengths)))  # no row lost, none repeated
        for b in batches:
            assert b, "empty batch"
            if len(b) == 1 and b[0] in over:
                continue  # a documented oversize row, alone in its batch
            assert not over.intersection(b), f"oversize row shares a batch: {b}"
            assert _cost(lengths, b, kw["cost"]) <= kw["max_tokens"]
            if kw["max_images"] is not None:
                assert int(num_images[b].sum()) <= kw["max_images"]
            if kw["max_rows"] is not None:
                assert len(b) <= kw["max_rows"]
        # deterministic: a fresh sampler with the same seed gives the same epoch
        again = TokenBudgetBatchSampler(lengths, num_images, **kw)
        again.set_epoch(epoch)
        assert list(again) == batches


def test_epochs_differ_when_shuffled_and_not_otherwise():
    rng = np.random.default_rng(0)
    lengths, imgs = rng.integers(20, 500, 300), rng.integers(0, 4, 300)
    s = TokenBudgetBatchSampler(lengths, imgs, max_tokens=2000, max_images=12, seed=7, bucket_size=64)
    epochs = []
    for e in range(4):
        s.set_epoch(e)
        epochs.append(list(s))
    assert all(epochs[i] != epochs[j] for i in range(4) for j in range(i))
    assert s.batches(1) == epochs[1]
    other_seed = TokenBudgetBatchSampler(lengths, imgs, max_tokens=2000, max_images=12, seed=8, bucket_size=64)
    assert list(other_seed) != epochs[0]
    fixed = TokenBudgetBatchSampler(lengths, imgs, max_tokens=2000, max_images=12, shuffle=False)
    first = list(fixed)
    fixed.set_epoch(5)
    assert list(fixed) == first


def test_length_grouping_pads_less_than_fixed_batches():
    rng = np.random.default_rng(1)
    lengths = np.concatenate([rng.integers(30, 120, 200), rng.integers(800, 1600, 40)])
    rng.shuffle(lengths)
    padded = TokenBudgetBatchSampler(lengths, max_tokens=4096, cost="padded", seed=0).batches()
    packed = TokenBudgetBatchSampler(lengths, max_tokens=4096, cost="packed", seed=0).batches()
    fixed = [list(range(i, min(i + 8, len(lengths)))) for i in range(0, len(lengths), 8)]
    e_fixed, e_padded = token_efficiency(lengths, fixed), token_efficiency(lengths, padded)
    assert e_padded > e_fixed + 0.2, (e_padded, e_fixed)
    assert token_efficiency(lengths, packed, cost="packed") == 1.0
    # first-fit fills packs: fewer packs than length-grouped padded batches, each mostly full
    assert len(packed) < len(padded)
    assert token_efficiency(lengths, packed, slots_per_batch=4096) > 0.9


def test_oversize_rows_raise_by_default_or_go_alone():
    lengths, imgs = [10, 500, 20, 30], [0, 1, 9, 1]
    with pytest.raises(ValueError, match=r"row 1 is over the batch budget on its own: 500 tokens \(max_tokens=100\)"):
        TokenBudgetBatchSampler(lengths, imgs, max_tokens=100)
    with pytest.raises(ValueError, match=r"row 2 .* 9 images \(max_images=4\)"):
        TokenBudgetBatchSampler(lengths, imgs, max_tokens=1000, max_images=4)
    s = TokenBudgetBatchSampler(lengths, imgs, max_tokens=100, max_images=4, oversize="alone", cost="packed")
    batches = list(s)
    assert [1] in batches and [2] in batches and sorted(i for b in batches for i in b) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="max_images needs num_images"):
        TokenBudgetBatchSampler(lengths, max_tokens=1000, max_images=3)
    with pytest.raises(ValueError, match="num_images has 2 entries but lengths has 4"):
        TokenBudgetBatchSampler(lengths, [1, 2], max_tokens=1000)


@pytest.fixture(scope="module")
def demo_raw():
    from mmpipe.cli import demo

    raw, _ = demo.build_rows(16, demo.image_pool())
    return raw


def test_token_counts_from_layout_only_encode_equal_the_full_encode(demo_raw):
    proc = processor_for("qwen2_vl")
    cols = demo_raw.column_names
    layout = demo_raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "none"}, remove_columns=cols)
    full = demo_raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=cols)
    lay_len, lay_img = token_counts(layout)
    full_len, full_img = token_counts(full)
    assert np.array_equal(lay_len, full_len) and np.array_equal(lay_img, full_img)
    assert lay_len.tolist() == [len(r["input_ids"]) for r in full]
    assert lay_img.tolist() == [len(r["image_grid_thw"]) for r in full]
    picked = full.select([5, 0, 3])  # an indices mapping over the table
    assert token_counts(picked)[0].tolist() == [full_len[5], full_len[0], full_len[3]]
    assert token_counts([mmpipe.MultiModalInputs.from_dict(full[i]) for i in (2, 1)])[0].tolist() == \
        [full_len[2], full_len[1]]
    with pytest.raises(ValueError, match="needs an encoded dataset with an 'input_ids' column"):
        token_counts(demo_raw)


def test_dataloader_padded_batches_under_budget_every_row_once(demo_raw):
    """Layout-only lengths drive the sampler; the uint8-encoded dataset is collated with the
    padded Collator in 2 workers; every padded batch's [B, L] stays under the budget."""
    from torch.utils.data import DataLoader

    proc = processor_for("qwen3_vl")
    cols = demo_raw.column_names
    layout = demo_raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "none"}, remove_columns=cols)
    enc = demo_raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=cols)
    budget, max_images = 700, 5
    sampler = TokenBudgetBatchSampler.from_dataset(layout, max_tokens=budget, max_images=max_images, seed=1)
    loader = DataLoader(mmpipe.ArrowRows(enc), batch_sampler=sampler, num_workers=2,
                        collate_fn=mmpipe.Collator(proc, padding_side="right"))
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        seen = []
        n_batches = 0
        for idx, batch in zip(sampler.batches(), loader):
            n_batches += 1
            assert batch.input_ids.numel() <= budget and batch.image_grid_thw.shape[0] <= max_images
            assert_roundtrip([enc[i] for i in idx], batch=batch)
            seen += idx
        assert n_batches == len(sampler) and sorted(seen) == list(range(len(enc)))


@settings(max_examples=100, deadline=None)
@given(token_budget_cases(), st.integers(2, 4))
def test_data_parallel_ranks_share_the_epoch(case, R):
    """num_replicas=R: every rank the same number of batches, budgets kept, the ranks' rows
    together every row exactly once; the same on each rank's own sampler object."""
    lengths, num_images, kw = case
    try:
        ranks = [TokenBudgetBatchSampler(lengths, num_images, num_replicas=R, rank=r, **kw) for r in range(R)]
        per_rank = [list(s) for s in ranks]
    except ValueError as e:
        assert "batches of one row each" in str(e)
        # splitting adds one batch at a time up to one batch per row: no multiple of R on the way
        b = len(TokenBudgetBatchSampler(lengths, num_images, **kw))
        assert not any(m % R == 0 for m in range(b, len(lengths) + 1))
        return
    assert len({len(b) for b in per_rank}) == 1 and all(len(s) == len(b) for s, b in zip(ranks, per_rank))
    flat = [i for b in per_rank for batch in b for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    L, imgs = np.asarray(lengths, np.int64), np.asarray(num_images, np.int64)
    over = set(ranks[0].oversized.tolist())
    for b in (batch for rb in per_rank for batch in rb):
        if len(b) == 1 and b[0] in over:
            continue
        assert _cost(L, b, kw["cost"]) <= kw["max_tokens"]
        if kw["max_images"] is not None:
            assert int(imgs[b].sum()) <= kw["max_images"]


def test_data_parallel_split_and_its_limit():
    # 2 rows in one batch, 2 ranks: the batch is split, one row per rank
    ranks = [list(TokenBudgetBatchSampler([3, 4], max_tokens=100, num_replicas=2, rank=r)) for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == [[0], [1]]
    # 2 rows, 3 ranks: a row is never split or repeated, so it cannot be even
    s = TokenBudgetBatchSampler([1, 1], max_tokens=100, num_replicas=3, rank=0)
    with pytest.raises(ValueError, match="cannot give each of 3 ranks the same number of batches"):
        len(s)
    assert "rank=0/3" in repr(s)
    with pytest.raises(ValueError, match="0 <= rank < num_replicas"):
        TokenBudgetBatchSampler([1, 1], max_tokens=100, num_replicas=2, rank=2)


def _generic_raw(counts):
    import datasets

    from mmpipe import testing

    return datasets.Dataset.from_list([
        {"messages": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": "Describe."}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Shapes."}]}],
         "images": [testing.tiny_image(40, 48, seed=10 * i + j) for j in range(k)]} for i, k in enumerate(counts)])


def test_generic_path_rows_count_their_images_and_keep_the_image_budget():
    """Generic-path rows (no image_grid_thw / tiles_per_image) count their images from
    image_hw (2 values per image): max_images is kept and a row over it alone is refused; rows
    of an earlier release (no image_hw) have no count, so max_images is an ArgumentError, never
    a silent 0 images per row."""
    from mmpipe.errors import ArgumentError, InputError
    from mmpipe.offline.other_vlms import build_foreign_processor

    proc = build_foreign_processor("idefics3")
    counts = [3, 2, 1, 0, 1]
    raw = _generic_raw(counts)
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "family": "generic"}, remove_columns=raw.column_names)
    lengths, num_images = token_counts(enc)
    assert num_images.tolist() == counts == [mmpipe.MultiModalInputs.from_dict(r).num_images for r in enc]
    assert token_counts(enc.select([2, 0]))[1].tolist() == [1, 3]
    assert token_counts([enc[i] for i in range(len(enc))])[1].tolist() == counts
    with pytest.raises(InputError, match=r"row 0 is over the batch budget on its own.*3 images \(max_images=2\)"):
        TokenBudgetBatchSampler.from_dataset(enc, max_tokens=10**6, max_images=2)
    s = TokenBudgetBatchSampler.from_dataset(enc, max_tokens=10**6, max_images=2, oversize="alone", shuffle=False)
    batches = list(s)
    assert sorted(i for b in batches for i in b) == list(range(len(counts)))
    assert all(sum(counts[i] for i in b) <= 2 for b in batches if b != [0]) and [0] in batches
    old = enc.remove_columns(["image_hw"])  # what the release before image_hw stored
    assert token_counts(old)[1] is None
    assert token_counts(old)[0].tolist() == lengths.tolist()
    with pytest.raises(ArgumentError, match="max_images needs each row's image count.*image_hw"):
        TokenBudgetBatchSampler.from_dataset(old, max_tokens=10**6, max_images=2)
    assert len(TokenBudgetBatchSampler.from_dataset(old, max_tokens=10**6).batches()) >= 1  # no image budget: fine


def test_from_dataset_refuses_an_iterable_dataset_with_a_typed_error(demo_raw):
    from mmpipe.errors import ArgumentError

    proc = processor_for("qwen2_vl")
    enc = demo_raw.select(range(4)).map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "none"},
                                        remove_columns=demo_raw.column_names)
    for data in (enc.to_iterable_dataset(), enc.to_iterable_dataset(num_shards=2)):
        with pytest.raises(ArgumentError, match="need a map-style datasets.Dataset.*got IterableDataset"):
            TokenBudgetBatchSampler.from_dataset(data, max_tokens=1000)
        with pytest.raises(ArgumentError, match="TokenBudgetBatchSampler\\(lengths, num_images"):
            token_counts(data)
