"""dataset.map(mmpipe.encode): per row, batched, num_proc=2, cache hits, stored schema."""

from __future__ import annotations

import datasets
import pytest

from helpers import raw_dataset
import mmpipe
from mmpipe import testing
from mmpipe.testing.invariants import assert_roundtrip

from conftest import processor_for


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return raw_dataset(tmp_path_factory.mktemp("raw"))


def test_per_row_batched_and_num_proc_agree(raw):
    proc = processor_for("qwen2_vl")
    kw = {"processor": proc}
    per_row = raw.map(mmpipe.encode, fn_kwargs=kw)
    batched = raw.map(mmpipe.encode, fn_kwargs=kw, batched=True, batch_size=5)
    procs = raw.map(mmpipe.encode, fn_kwargs=kw, num_proc=2)
    indexed = raw.map(mmpipe.encode, fn_kwargs=kw, with_indices=True, batched=True, batch_size=4)
    for a, b, c, d in zip(per_row, batched, procs, indexed):
        ra = mmpipe.MultiModalInputs.from_dict(a)
        assert ra == mmpipe.MultiModalInputs.from_dict(b) == mmpipe.MultiModalInputs.from_dict(c) \
            == mmpipe.MultiModalInputs.from_dict(d)
    assert per_row.data.table.equals(procs.data.table)


def test_same_map_twice_is_a_cache_hit(raw):
    proc = processor_for("qwen2_vl")
    first = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "max_length": 4096})
    again = raw.map(mmpipe.encode, fn_kwargs={"processor": testing.build_processor("qwen2_vl"), "max_length": 4096})
    assert again._fingerprint == first._fingerprint
    assert again.cache_files == first.cache_files
    other = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "max_length": 4000})
    assert other._fingerprint != first._fingerprint


@pytest.mark.parametrize("pixels", ["uint8", "float32", "none"])
def test_stored_columns_follow_the_declared_schema(raw, pixels):
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": processor_for("qwen3_vl"), "pixels": pixels},
                  remove_columns=raw.column_names)
    declared = mmpipe.MultiModalInputs.arrow_schema(pixels)
    got = enc.data.schema
    assert set(got.names) == set(declared.names)
    for f in declared:
        assert got.field(f.name).type == f.type, f.name
    assert enc.features == mmpipe.MultiModalInputs.features(pixels)


def test_uint8_storage_is_an_eighth_of_float32(raw):
    proc = processor_for("qwen2_vl")
    u8 = raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, remove_columns=raw.column_names)
    f32 = raw.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "float32"}, remove_columns=raw.column_names)
    u8_bytes = u8.data.table.column("pixel_values_u8").nbytes
    f32_bytes = f32.data.table.column("pixel_values").nbytes
    assert u8_bytes * 8 <= f32_bytes * 1.001


def test_the_readme_flow_end_to_end(raw):
    """The issue's user flow verbatim: map with num_proc=2 (input columns kept), DataLoader
    with workers, the model's forward on the batch, unbatch back to the encoded rows."""
    import torch

    from conftest import model_for

    processor = processor_for("qwen2_vl")
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": processor}, num_proc=2)
    loader = torch.utils.data.DataLoader(enc, batch_size=8, collate_fn=mmpipe.Collator(processor), num_workers=2)
    batch = next(iter(loader))
    assert isinstance(batch, mmpipe.BatchedMultiModalInputs)
    with torch.no_grad():
        out = model_for("qwen2_vl")(**batch.model_inputs())
    assert out.logits.shape[:2] == batch.input_ids.shape
    assert_roundtrip([enc[i] for i in range(8)], batch=batch)


@pytest.mark.parametrize("media", ["image", "image_torchvision", "video"])
def test_num_proc_map_after_parallel_torch_in_parent_does_not_hang(tmp_path, media):
    """Regression: forked datasets.map workers deadlocked in their first parallel torch op
    when the parent had already used torch's thread pool (building a model does): positions,
    and the torch resize that every video frame and torchvision-backend image goes through
    (it ran before the row's positions, so a video row hung its worker)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import datasets, torch, mmpipe
        from mmpipe import testing
        datasets.disable_progress_bars()
        torch.set_num_threads(2)
        torch.repeat_interleave(torch.arange(400000), torch.full((400000,), 2))  # warm the pool
        proc = testing.build_processor("qwen2_vl")
        media = MEDIA
        im = testing.tiny_image(60, 80) if media == "image" else testing.tiny_image(250, 330)  # resized: torch works
        item = "video" if media == "video" else "image"
        ds = datasets.Dataset.from_dict({
            "messages": [[{"role": "user", "content": [{"type": item}, {"type": "text", "text": str(i)}]}]
                         for i in range(8)],
            "images": [[im] if item == "image" else [] for _ in range(8)],
            "videos": [[[im, im, im, im]] if item == "video" else [] for _ in range(8)]})
        kw = {"image_backend": "torchvision"} if media == "image_torchvision" else {}
        enc = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, **kw}, num_proc=2)
        print("done", len(enc), sum(len(g) for g in enc["video_grid_thw"]))
    """).replace("MEDIA", repr(media))
    # a hang guard (a forked pool that hangs never ends): ~9-12 s on 2 cores, so 300 s is >20x that
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"done 8 {8 if media == 'video' else 0}" in out.stdout, out.stdout


# ---- bounded memory: mmpipe.map_kwargs (issue 18) ------------------------------------------
def _flushes(ds) -> list[int]:
    """Rows per record batch of a mapped dataset's cache file(s): one per writer flush."""
    return [b.num_rows for b in ds.data.table.to_batches()]


def test_map_kwargs_follow_the_row_byte_bound(raw):
    real = testing.build_processor("qwen2_vl", min_pixels=3136, max_pixels=12845056)  # released bounds
    one_image = 2**20 + 3 * 12845056  # token allowance + uint8 pixels of one image at max_pixels
    assert mmpipe.map_kwargs(real) == {"writer_batch_size": 256 * 2**20 // one_image,
                                       "batch_size": 256 * 2**20 // one_image}
    assert mmpipe.encoding.dataset.max_images_per_row(raw) == 3  # Arrow list lengths
    assert mmpipe.map_kwargs(real, raw)["writer_batch_size"] == 256 * 2**20 // (2**20 + 3 * 3 * 12845056)
    assert mmpipe.map_kwargs(real, raw, pixels="float32")["batch_size"] == 1  # 8x the bytes: one row at a time
    assert mmpipe.map_kwargs(real, raw, pixels="none")["batch_size"] == 256  # token arrays only
    assert mmpipe.map_kwargs(processor_for("qwen2_vl"), raw, max_pixels=12845056) == mmpipe.map_kwargs(real, raw)
    with pytest.raises(mmpipe.errors.ArgumentError):
        mmpipe.map_kwargs(real, pixels="u8")


def test_map_kwargs_count_the_videos_of_a_row():
    """A ``videos`` column: the bound adds the most videos any row holds (Arrow list lengths) x
    the largest video the encoder's video options allow, so a row of long clips is written alone."""
    import datasets

    from mmpipe.encoding.dataset import row_byte_bound
    from mmpipe.encoding.videos import video_row_bytes

    proc = processor_for("qwen2_vl")
    ds = datasets.Dataset.from_dict({"videos": [["a.mp4"], ["b.mp4", "c.mp4"], []],
                                     "images": [[], [], []]})
    enc = mmpipe.Encoder(proc, video_options={"max_frames": 16})
    per_video = video_row_bytes(enc, ds) // 2
    assert per_video > 0 and video_row_bytes(enc, ds) == 2 * per_video  # two videos in the fullest row
    got = mmpipe.map_kwargs(proc, ds, video_options={"max_frames": 16})["writer_batch_size"]
    assert got == max(1, min(1000, 256 * 2**20 // (row_byte_bound(enc, 1) + 2 * per_video)))
    assert got < mmpipe.map_kwargs(proc, ds.remove_columns("videos"))["writer_batch_size"]
    assert mmpipe.map_kwargs(proc, ds)["writer_batch_size"] <= got  # the defaults allow up to 768 frames


@pytest.mark.parametrize("batched", [False, True])
def test_documented_map_flushes_every_k_rows(raw, tmp_path, batched):
    """The README's call with ``**mmpipe.map_kwargs(processor, ds)``: each process's writer
    flushes every k rows (k from the row byte bound), and the rows equal datasets' defaults."""
    proc = testing.build_processor("qwen2_vl", min_pixels=3136, max_pixels=12845056)
    kw = mmpipe.map_kwargs(proc, raw)
    k = kw["writer_batch_size"]
    assert 1 <= k < len(raw) // 2
    enc = raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, num_proc=2, batched=batched,
                  cache_file_name=str(tmp_path / "enc.arrow"), **kw)
    flushes = _flushes(enc)
    assert max(flushes) <= k and sum(flushes) == len(raw)
    assert len(flushes) >= -(-len(raw) // k)
    plain = raw.map(mmpipe.encode, fn_kwargs={"processor": proc}, cache_file_name=str(tmp_path / "plain.arrow"))
    assert max(_flushes(plain)) == len(raw)  # datasets' default buffer: everything held until the end
    assert enc.data.table.equals(plain.data.table)


def test_encode_dataset_bounds_its_batches_and_writer(raw):
    proc = testing.build_processor("qwen2_vl", min_pixels=3136, max_pixels=12845056)
    enc, report = mmpipe.encode_dataset(raw, proc, num_proc=2)
    assert report.rows_out == len(raw)
    assert max(_flushes(enc)) <= mmpipe.map_kwargs(proc, raw)["writer_batch_size"]
