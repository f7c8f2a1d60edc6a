"""Real-world image files and PIL objects that once went wrong (the image defect hunt): big-endian
16-bit TIFFs (PIL mode ``I;16B``, and the ``I;16L`` / ``I;16N`` variants), PIL modes neither PNG
nor TIFF stores on the ``pixels="source"`` route (``RGBa``, ``HSV``, ``La``), PIL images whose
file was closed before they were read or that were unpickled in another process (a DataLoader
worker's), PNGs whose orientation is in XMP or in an ``eXIf`` chunk
after the image data, and the GLM-4.1V aspect-ratio refusal's message.

Pixels are compared bit for bit with the transformers processor given the image as
``datasets.Image()`` decodes it (load, then ``exif_transpose`` by ``getexif``); the layout-only
routes (``pixels="none"``, the batched layout path, the header reads) must give the uint8 route's
grids, without decoding."""

from __future__ import annotations

import io
import struct
import zlib

import datasets
import numpy as np
import pytest
from PIL import Image, PngImagePlugin

import mmpipe
from mmpipe import testing
from mmpipe.encoding import layout_batch
from mmpipe.encoding.dataset import make_encoder
from mmpipe.errors import ImageError, InputError
from mmpipe.images.headers import plain_image_hw
from mmpipe.images.load import image_hw

from conftest import processor_for

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]


def _row(value) -> dict:
    return {"messages": MESSAGES, "images": [value]}


def _decoded(data: bytes) -> Image.Image:
    return datasets.Image().decode_example({"bytes": data, "path": None})


def _stock(proc, img: Image.Image) -> dict:
    text = proc.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    out = proc(text=[text], images=[img], return_tensors="np")
    return {"pixel_values": np.asarray(out["pixel_values"]), "image_grid_thw": np.asarray(out["image_grid_thw"])}


def _collated(proc, value, pixels: str = "uint8") -> np.ndarray:
    row = mmpipe.encode_row(_row(value), proc, idx=7, labels=False, pixels=pixels)
    return np.asarray(mmpipe.collate([row], processor=proc).pixel_values)


def _grid(proc, value, pixels: str) -> list:
    return mmpipe.encode_row(_row(value), proc, idx=7, labels=False, pixels=pixels).image_grid_thw.tolist()


def _assert_as_stock(proc, value, ref_img: Image.Image) -> None:
    """uint8 and source rows collate to the processor's pixel_values on ``ref_img``; every route's grid is its."""
    ref = _stock(proc, ref_img)
    for pixels in ("uint8", "source"):
        got = _collated(proc, value, pixels)
        assert got.shape == ref["pixel_values"].shape and np.array_equal(got, ref["pixel_values"]), pixels
    for pixels in ("uint8", "source", "none"):
        assert _grid(proc, value, pixels) == ref["image_grid_thw"].tolist(), pixels


def _assert_image_error(e: InputError, *words: str) -> None:
    assert isinstance(e, ImageError)
    assert e.row == 7 and e.column == "images" and e.image == 0
    assert e.expected and e.found and e.fix
    for w in words:
        assert w in str(e), (w, str(e))


# ---- 16-bit images of either byte order ---------------------------------------------------
def _gray16(values_max: int = 255) -> np.ndarray:
    g = np.asarray(testing.tiny_image(40, 60, seed=2).convert("L")).astype(np.uint16)
    return g if values_max == 255 else g * (values_max // 255)


def _tiff(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "TIFF")
    return buf.getvalue()


def test_big_endian_16bit_tiff_encodes_as_the_processor():
    """An ``MM`` 16-bit TIFF (PIL mode I;16B) of values 0..255: encoded like its I;16 twin, equal to
    the processor on the datasets-decoded image (it was "corrupt or truncated")."""
    proc = processor_for("qwen2_vl")
    data = _tiff(_gray16().astype(">u2"))
    assert data[:2] == b"MM" and _decoded(data).mode == "I;16B"
    _assert_as_stock(proc, {"bytes": data, "path": None}, _decoded(data))


@pytest.mark.parametrize("mode", ["I;16B", "I;16L", "I;16N"])
def test_16bit_byte_orders_as_pil_images(mode):
    """In-memory 16-bit PIL images of each byte order: the processor's pixels on every route."""
    proc = processor_for("qwen2_vl")
    g = _gray16()
    dtype = {"I;16B": ">u2", "I;16L": "<u2", "I;16N": "=u2"}[mode]
    img = Image.frombytes(mode, (g.shape[1], g.shape[0]), g.astype(dtype).tobytes())
    assert img.mode == mode
    _assert_as_stock(proc, img, img)


@pytest.mark.parametrize("order", [">u2", "<u2"])
def test_16bit_values_past_255_are_the_wash_out_error(order):
    """Values above 255 are the documented 16-bit refusal on the pixel routes, not a corrupt file."""
    proc = processor_for("qwen2_vl")
    data = _tiff(_gray16(65535).astype(order))
    for pixels in ("uint8", "source"):
        with pytest.raises(ImageError) as e:
            mmpipe.encode_row(_row({"bytes": data, "path": None}), proc, idx=7, pixels=pixels)
        _assert_image_error(e.value, "wash the image out", "I;16")
        assert "corrupt" not in str(e.value)


# ---- PIL modes neither PNG nor TIFF stores ----------------------------------------------------
def _in_mode(mode: str) -> Image.Image:
    base = testing.tiny_image(40, 60, seed=2)
    if mode in ("RGBa", "La"):
        return base.convert("RGBA" if mode == "RGBa" else "LA").convert(mode)
    return base.convert(mode)


@pytest.mark.parametrize("mode", ["RGBa", "HSV"])
def test_source_route_stores_modes_png_and_tiff_lack(mode):
    """``pixels="source"`` of an RGBa / HSV PIL image: bit for bit the uint8 route (and the
    processor), where it raised PIL's untyped OSError."""
    proc = processor_for("qwen2_vl")
    img = _in_mode(mode)
    assert img.mode == mode
    _assert_as_stock(proc, img, img)
    assert np.array_equal(_collated(proc, img, "source"), _collated(proc, img, "uint8"))
    out = mmpipe.encode(_row(img), 7, processor=proc, pixels="source", on_error="skip")
    assert not out.get("mmpipe_error")


def test_a_mode_pil_cannot_convert_is_a_typed_error_on_both_routes():
    """La (premultiplied LA): PIL cannot convert it to RGB (nor can the processor): the same typed
    ImageError on the uint8 and source routes, naming the mode and the fix."""
    proc = processor_for("qwen2_vl")
    img = _in_mode("La")
    for pixels in ("uint8", "source"):
        with pytest.raises(ImageError) as e:
            mmpipe.encode_row(_row(img), proc, idx=7, pixels=pixels)
        _assert_image_error(e.value, "mode La", "convert('LA')")
        assert "corrupt" not in str(e.value)
    out = mmpipe.encode(_row(img), 7, processor=proc, pixels="source", on_error="skip")
    assert '"stage": "image"' in out["mmpipe_error"] and "mode La" in out["mmpipe_error"]


# ---- a PIL image whose file was closed before it was read --------------------------------------
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_closed_pil_image_is_a_typed_error_on_every_route(tmp_path, fmt):
    proc = processor_for("qwen2_vl")
    path = tmp_path / f"img.{fmt.lower()}"
    testing.tiny_image(40, 60).save(path, fmt)
    with Image.open(path) as im:
        closed = im  # not decoded: PIL reads the pixels on first use
    for pixels in ("uint8", "source", "none"):
        with pytest.raises(ImageError) as e:
            mmpipe.encode_row(_row(closed), proc, idx=7, pixels=pixels)
        _assert_image_error(e.value, "closed before", ".load()", "path or bytes")
        assert "corrupt" not in str(e.value)
    out = mmpipe.encode(_row(closed), 7, processor=proc, on_error="skip")
    assert '"stage": "image"' in out["mmpipe_error"] and "closed before" in out["mmpipe_error"]
    with Image.open(path) as im:  # loaded inside the block: fine, the processor's pixels
        im.load()
        loaded = im
    _assert_as_stock(proc, loaded, _decoded(path.read_bytes()))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_pil_image_unpickled_in_another_process_encodes_as_the_processor(fmt):
    """A decoded image handed back by a DataLoader worker (pickle) has no ``fp`` attribute at all;
    it raised a bare ``AttributeError`` where a file-backed image's ``fp`` was read."""
    import pickle

    proc = processor_for("qwen2_vl")
    buf = io.BytesIO()
    testing.tiny_image(40, 60).save(buf, fmt)
    im = _decoded(buf.getvalue())
    moved = pickle.loads(pickle.dumps(im))
    assert not hasattr(moved, "fp")  # what makes it differ from the image it was
    _assert_as_stock(proc, moved, im)


# ---- PNG orientation after the image data or in XMP -------------------------------------------
def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _xmp(orientation: int, element: bool = False) -> str:
    tag = (f"><tiff:Orientation>{orientation}</tiff:Orientation></rdf:Description>" if element
           else f' tiff:Orientation="{orientation}"/>')
    return ('<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
            '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description rdf:about="" '
            f'xmlns:tiff="http://ns.adobe.com/tiff/1.0/"{tag}</rdf:RDF></x:xmpmeta><?xpacket end="w"?>')


def _exif(orientation=None, **tags) -> bytes:
    ex = Image.Exif()
    if orientation is not None:
        ex[0x0112] = orientation
    ex[0x010F] = "maker"  # a tag besides: an EXIF block without orientation
    data = ex.tobytes()
    return data[6:] if data.startswith(b"Exif\x00\x00") else data


def _itxt(text: str, compressed: bool = False, key: bytes = b"XML:com.adobe.xmp") -> bytes:
    body = text.encode()
    return _chunk(b"iTXt", key + b"\0" + (b"\1\0" if compressed else b"\0\0") + b"\0\0"
                  + (zlib.compress(body) if compressed else body))


def _raw_profile(orientation: int) -> bytes:
    ex = Image.Exif()
    ex[0x0112] = orientation
    data = ex.tobytes()
    text = f"\nexif\n{len(data):8}\n{data.hex()}\n"
    return _chunk(b"zTXt", b"Raw profile type exif\0\0" + zlib.compress(text.encode("latin-1")))


def _png(before: bytes = b"", after: bytes = b"", after_iend: bytes = b"", seed: int = 3) -> bytes:
    """A 90 wide, 40 tall PNG with ``before`` inserted before its first IDAT and ``after`` after
    its last (before IEND)."""
    buf = io.BytesIO()
    testing.tiny_image(40, 90, seed=seed).save(buf, "PNG")
    png = buf.getvalue()
    idat, iend = png.index(b"IDAT") - 4, png.rindex(b"IEND") - 4
    return png[:idat] + before + png[idat:iend] + after + png[iend:] + after_iend


def _apng(meta: bytes, at_end: bool) -> bytes:
    """A 3-frame APNG (90 wide, 40 tall) with ``meta`` right after its first frame's image data, or
    at its end (PIL's load of the first frame stops at the next frame's fcTL: not read)."""
    buf = io.BytesIO()
    frames = [testing.tiny_image(40, 90, seed=s) for s in range(3)]
    frames[0].save(buf, "PNG", save_all=True, append_images=frames[1:])
    png = buf.getvalue()
    if at_end:
        at = png.rindex(b"IEND") - 4
    else:
        at = png.index(b"IDAT") - 4
        while png[at + 4:at + 8] == b"IDAT":
            at += 12 + struct.unpack(">I", png[at:at + 4])[0]
    return png[:at] + meta + png[at:]


def _orientation_pngs() -> dict[str, bytes]:
    pnginfo = PngImagePlugin.PngInfo()
    pnginfo.add_itxt("XML:com.adobe.xmp", _xmp(6))
    buf = io.BytesIO()
    testing.tiny_image(40, 90, seed=3).save(buf, "PNG", pnginfo=pnginfo)
    return {
        "xmp_itxt_by_pil": buf.getvalue(),
        "xmp_after_data": _png(after=_itxt(_xmp(6))),
        "xmp_compressed_after_data": _png(after=_itxt(_xmp(8), compressed=True)),
        "xmp_text_before_data": _png(before=_chunk(b"tEXt", b"XML:com.adobe.xmp\0" + _xmp(6).encode())),
        "xmp_element_in_text": _png(after=_chunk(b"tEXt", b"XML:com.adobe.xmp\0" + _xmp(5, element=True).encode())),
        "xmp_mirror_only": _png(before=_itxt(_xmp(2))),
        "exif_after_data": _png(after=_chunk(b"eXIf", _exif(6))),
        "exif_both_late_wins": _png(before=_chunk(b"eXIf", _exif(6)), after=_chunk(b"eXIf", _exif(3))),
        "exif_without_orientation_then_xmp": _png(before=_chunk(b"eXIf", _exif()), after=_itxt(_xmp(7))),
        "exif_over_xmp": _png(before=_itxt(_xmp(6)), after=_chunk(b"eXIf", _exif(1))),
        "raw_profile_after_data": _png(after=_raw_profile(6)),
        "after_iend_ignored": _png(after_iend=_chunk(b"eXIf", _exif(6))),
        "after_a_broken_chunk_ignored": _png(after=b"\0\0\0\0\xff\xfe\xfd\xfc\0\0\0\0" + _chunk(b"eXIf", _exif(6))),
        "apng_xmp_after_first_frame": _apng(_itxt(_xmp(6)), at_end=False),
        "apng_xmp_after_last_frame_ignored": _apng(_itxt(_xmp(6)), at_end=True),
        "plain": _png(),
    }


PNGS = _orientation_pngs()


def _upright_hw(data: bytes) -> tuple:
    w, h = _decoded(data).size
    return h, w


@pytest.mark.parametrize("name", sorted(PNGS))
def test_png_orientation_as_datasets_decodes_it(name, tmp_path):
    """Every route orients these PNGs as datasets decodes them: the header reads (bytes, path, PIL
    image, the plain-PNG reader), and the uint8 / source / none rows against the processor."""
    data = PNGS[name]
    path = tmp_path / "img.png"
    path.write_bytes(data)
    want = _upright_hw(data)
    if name.endswith("ignored") or name == "plain":
        assert want == (40, 90)
    elif "mirror" not in name and "both" not in name and "over_xmp" not in name:
        assert want == (90, 40), name  # the variant does rotate
    assert image_hw(data) == want
    assert image_hw(str(path)) == want
    assert image_hw(Image.open(path)) == want
    assert image_hw(Image.open(io.BytesIO(data))) == want
    assert plain_image_hw(data) in (None, want)
    if name != "plain":
        assert plain_image_hw(data) is None or name.endswith("ignored")
    proc = processor_for("qwen2_vl")
    _assert_as_stock(proc, {"bytes": data, "path": None}, _decoded(data))
    assert _grid(proc, str(path), "none") == _grid(proc, Image.open(path), "none") == _grid(proc, str(path), "uint8")
    lazy = Image.open(io.BytesIO(data))
    assert _grid(proc, lazy, "none") == _grid(proc, str(path), "uint8")
    assert getattr(lazy, "_im", None) is None  # the layout route read the chunk list: nothing decoded
    for pixels in ("uint8", "source"):  # a PIL image opened from the path: its pixels (stored re-encoded) too
        assert np.array_equal(_collated(proc, Image.open(path), pixels), _collated(proc, str(path), pixels)), pixels


def test_batched_layout_path_orients_pngs_as_the_uint8_route():
    """The batched layout-only path (header sizes without PIL where it can) gives each row the grid
    of the uint8 route and of the processor on the datasets-decoded image, the PNGs with late or XMP
    orientations included."""
    proc = processor_for("qwen2_vl")
    rows = [_row({"bytes": data, "path": None}) for data in PNGS.values()]
    cols, fast = layout_batch.encode_layout(make_encoder(proc, pixels="none"), rows, list(range(len(rows))))
    assert fast == list(range(len(rows)))
    for j, data in enumerate(PNGS.values()):
        want = _stock(proc, _decoded(data))["image_grid_thw"].tolist()
        assert np.asarray(cols["image_grid_thw"][j]).tolist() == want == _grid(proc, {"bytes": data, "path": None}, "uint8")


def test_png_orientation_on_mutated_bytes():
    """Damaged orientation PNGs (bytes flipped, cut, inserted, chunks duplicated): wherever datasets
    decodes the file, the header read gives its upright size."""
    rng = np.random.default_rng(0)
    datas = [d for n, d in sorted(PNGS.items()) if n != "plain"]
    compared = 0
    for trial in range(240):
        data = bytearray(datas[trial % len(datas)])
        op, at = trial % 4, int(rng.integers(8, len(data)))
        if op == 0:
            data[at] ^= 1 << int(rng.integers(0, 8))
        elif op == 1:
            data = data[:at]
        elif op == 2:
            data[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 5)), dtype=np.uint8))
        else:  # a late chunk again at the end, or before IEND
            iend = bytes(data).rindex(b"IEND") - 4 if b"IEND" in data else len(data)
            data[iend:iend] = _chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + _xmp(int(rng.integers(0, 10))).encode())
        data = bytes(data)
        try:
            want = _upright_hw(data)
        except Exception:  # noqa: BLE001 - datasets cannot decode it: nothing to compare
            continue
        try:
            got = image_hw(data)
        except InputError:
            continue
        compared += 1
        assert got == want, (trial, op, at)
        assert plain_image_hw(data) in (None, want)
    assert compared > 60


# ---- the aspect-ratio refusal names the file and the family -----------------------------------
@pytest.mark.parametrize("family", ["glm4v", "qwen2_vl"])
def test_aspect_ratio_error_names_the_file_size_and_family(family):
    proc = processor_for(family)
    buf = io.BytesIO()
    Image.fromarray(np.zeros((1, 3000, 3), np.uint8)).save(buf, "PNG")
    for pixels in ("uint8", "none"):
        with pytest.raises(ImageError) as e:
            mmpipe.encode_row(_row({"bytes": buf.getvalue(), "path": None}), proc, idx=7, pixels=pixels)
        msg = str(e.value)
        assert "image 1x3000 (height x width)" in msg and "aspect ratio 3000.0" in msg, msg
        assert f"{family} processors need it to be at most 200" in msg, msg
        assert "84000" not in msg and "Qwen-VL" not in msg
