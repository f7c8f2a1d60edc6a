"""The bad-input corpus: every case builds its own input (nothing is downloaded) and states
its expected outcome - success with what must hold, or an error class, stage, column and
message substrings. ``tests/test_bad_inputs.py`` runs every case; the fuzz tests reuse the
builders.

A case runs through one public stage:
- ``"encode"``: ``mmpipe.encode_row(row, processor, idx=ROW, pixels="float32", **options)``
  and again layout-only (``pixels="none"``), which must agree (same grid, or same error;
  ``layout="ok"`` where the failure is in pixel data a header-only read cannot see);
- ``"collate"``: ``mmpipe.Collator(processor)(rows)`` over rows built by ``build``, the bad
  one at batch index ``BAD``.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from PIL import Image, ImageOps

import mmpipe
from mmpipe.errors import (
    FamilyMismatchError,
    ImageError,
    InputError,
    ParseError,
    PixelDataError,
    PlaceholderError,
    TruncationError,
)
from mmpipe.testing import tiny_image

ROW = 7  # the dataset row index encode cases run under: every error must name it
BAD = 1  # the batch index of the bad row in collate cases


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path], Any]  # tmp dir -> raw row (encode) or list of encoded rows (collate)
    raises: Optional[type] = None  # None: must succeed
    contains: tuple = ()  # substrings the message must hold
    err_stage: Optional[str] = None  # expected InputError.stage
    column: Optional[str] = None  # expected InputError.column
    stage: str = "encode"  # "encode" | "collate"
    options: dict = field(default_factory=dict)
    family: str = "qwen2_vl"
    check: Optional[Callable] = None  # ok cases: check(result, row, processor) asserts what must hold
    layout: str = "same"  # encode cases: "same" outcome layout-only, or "ok" (header is fine)
    holds: str = ""  # what must hold, in words (the report table)

    @property
    def outcome(self) -> str:
        return "ok: " + self.holds if self.raises is None else f"{self.raises.__name__} [{self.err_stage}]"


# ---- builders ------------------------------------------------------------------------
def png_bytes(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG", **kw)
    return buf.getvalue()


def jpeg_bytes(img: Image.Image, orientation: Optional[int] = None, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    kw = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kw["exif"] = exif.tobytes()
    img.save(buf, "JPEG", quality=quality, **kw)
    return buf.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width x height`` grayscale, with an empty image stream."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def user_row(images: list, text: str = "Describe.", placeholders: Optional[int] = None, **extra) -> dict:
    """Hub-style row: one user turn with ``placeholders`` image items (default: one per image)."""
    n = len(images) if placeholders is None else placeholders
    content = [{"type": "image"} for _ in range(n)] + [{"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": content}], "images": images, **extra}


def one_image(value) -> Callable[[Path], dict]:
    return lambda tmp: user_row([value() if callable(value) else value])


def photo(h: int = 40, w: int = 60, seed: int = 1) -> Image.Image:
    return tiny_image(h, w, seed=seed)


def with_alpha(img: Image.Image, seed: int = 0) -> Image.Image:
    a = np.asarray(img.convert("RGBA")).copy()
    a[..., 3] = np.random.default_rng(seed).integers(0, 256, a.shape[:2])
    return Image.fromarray(a, "RGBA")


def palette_with_transparency() -> Image.Image:
    p = photo().convert("P")
    p.info["transparency"] = 3
    return Image.open(io.BytesIO(png_bytes(p)))


def gray16(hi: int) -> Image.Image:
    arr = np.linspace(0, hi, 40 * 60).reshape(40, 60).astype(np.uint16)
    return Image.open(io.BytesIO(png_bytes(Image.fromarray(arr))))


def smooth_gray(h: int, w: int) -> Image.Image:
    return Image.linear_gradient("L").resize((w, h), Image.BILINEAR)


def exif_jpeg(orientation: int = 6) -> bytes:
    return jpeg_bytes(photo(40, 64, seed=3), orientation=orientation)


def data_uri(data: bytes, kind: str = "png") -> str:
    import base64

    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def write(tmp: Path, name: str, data: bytes) -> str:
    path = tmp / name
    path.write_bytes(data)
    return str(path)


# ---- checks for "ok" cases -------------------------------------------------------------
def processor_pixels(processor, images: list) -> dict:
    out = processor.image_processor(images=images, return_tensors="np")
    return {"pixel_values": np.asarray(out["pixel_values"]), "image_grid_thw": np.asarray(out["image_grid_thw"])}


def _pil(value) -> Image.Image:
    if isinstance(value, bytes):
        return Image.open(io.BytesIO(value))
    if isinstance(value, dict):
        return Image.open(io.BytesIO(value["bytes"]))
    if isinstance(value, str) and value.startswith("data:"):
        import base64

        return Image.open(io.BytesIO(base64.b64decode(value.partition(",")[2])))
    if isinstance(value, str):
        return Image.open(value[len("file://"):] if value.startswith("file://") else value)
    if isinstance(value, np.ndarray):
        return Image.fromarray(value)
    return value


def same_as_processor(result, row, processor) -> None:
    """pixel_values and grids equal the transformers processor's, bit for bit."""
    ref = processor_pixels(processor, [_pil(v) for v in row["images"]])
    np.testing.assert_array_equal(result.image_grid_thw, ref["image_grid_thw"])
    np.testing.assert_array_equal(result.pixel_values, ref["pixel_values"])


def upright_as_processor(result, row, processor) -> None:
    """Equal to the processor given the upright (exif_transposed) image; differs from the
    processor given the raw image (it ignores the EXIF tag)."""
    img = _pil(row["images"][0])
    ref = processor_pixels(processor, [ImageOps.exif_transpose(img)])
    np.testing.assert_array_equal(result.image_grid_thw, ref["image_grid_thw"])
    np.testing.assert_array_equal(result.pixel_values, ref["pixel_values"])
    raw = processor_pixels(processor, [_pil(row["images"][0])])
    assert raw["image_grid_thw"].tolist() != ref["image_grid_thw"].tolist()  # the processor's (wrong) sideways grid


def within_max_pixels(result, row, processor) -> None:
    spec = mmpipe.VisionSpec.from_processor(processor)
    t, h, w = (int(x) for x in result.image_grid_thw[0])
    assert h * w * spec.patch_size**2 <= spec.max_pixels
    same_as_processor(result, row, processor)


def image_tokens_unlabelled(result, row, processor) -> None:
    same_as_processor(result, row, processor)
    assert (result.labels[result.mm_token_type_ids == 1] == -100).all()
    assert (result.labels != -100).any()


def truncated_text_only(result, row, processor) -> None:
    assert result.num_tokens == 40
    result.validate()  # image tokens still match the grid
    assert int((result.mm_token_type_ids == 1).sum()) == int(result.image_grid_thw.prod()) // 4


# ---- collate builders ------------------------------------------------------------------
def encoded_rows(family: str = "qwen2_vl", pixels: str = "uint8", n: int = 3) -> list[dict]:
    from conftest import processor_for

    proc = processor_for(family)
    return [
        mmpipe.encode_row(user_row([photo(30 + 8 * i, 40, seed=i)]), proc, idx=i, pixels=pixels).to_dict()
        for i in range(n)
    ]


def mutate(pixels: str, fn: Callable[[dict], None], family: str = "qwen2_vl") -> Callable[[Path], list]:
    def build(tmp):
        rows = encoded_rows(family, pixels)
        fn(rows[BAD])
        return rows
    return build


def _set(key, value_fn):
    def fn(r):
        r[key] = value_fn(r)
    return fn


def _float_pv(r, value):
    pv = np.asarray(r["pixel_values"], dtype=np.float32).copy()
    pv[3, 5] = value
    r["pixel_values"] = pv


def _grid_off_by_one(r):
    g = np.asarray(r["image_grid_thw"]).copy()
    g[0, 1] += 2
    r["image_grid_thw"] = g


def _failed_row(r):
    r["mmpipe_error"] = '{"row": 1, "stage": "image", "column": "images", "reason": "cannot read"}'


# ---- the corpus ------------------------------------------------------------------------
IMG = dict(err_stage="image", column="images")
CASES: list[Case] = [
    # bytes and paths
    Case("corrupt_bytes", one_image(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4), ImageError,
         ("row 7, image 0", "cannot read the image"), **IMG),
    Case("random_bytes", one_image(np.random.default_rng(0).bytes(500)), ImageError, ("cannot read the image",), **IMG),
    Case("empty_bytes", one_image(b""), ImageError, ("cannot read the image",), **IMG),
    Case("truncated_png", one_image(lambda: png_bytes(photo(64, 64))[:400]), ImageError,
         ("row 7, image 0", "cannot read the image", "truncated"), layout="ok", **IMG),
    Case("truncated_jpeg", one_image(lambda: (lambda b: b[: len(b) * 2 // 3])(jpeg_bytes(photo(64, 64)))), ImageError,
         ("cannot read the image", "truncated"), layout="ok", **IMG),
    Case("truncated_jpeg_header", one_image(lambda: jpeg_bytes(photo(64, 64))[:300]), ImageError,
         ("cannot read the image",), **IMG),
    Case("second_image_corrupt_threaded", lambda tmp: user_row([png_bytes(photo()), b"junk", png_bytes(photo(30, 30))]),
         ImageError, ("row 7, image 1: cannot read the image",), options={"threads": 3}, **IMG),
    Case("missing_path", lambda tmp: user_row([str(tmp / "nope.png")]), ImageError,
         ("no such file", "nope.png", "fix the path"), **IMG),
    Case("missing_path_in_dict", lambda tmp: user_row([{"bytes": None, "path": str(tmp / "gone.jpg")}]), ImageError,
         ("no such file",), **IMG),
    Case("dict_without_bytes_or_path", one_image({"bytes": None, "path": None}), ImageError,
         ("neither 'bytes' nor 'path'",), **IMG),
    Case("unsupported_type", one_image(12345), ImageError, ("unsupported image value of type int",), **IMG),
    Case("path_to_png", lambda tmp: user_row([write(tmp, "a.png", png_bytes(photo()))]), holds="equals the processor",
         check=same_as_processor),
    Case("file_uri", lambda tmp: user_row(["file://" + write(tmp, "b.png", png_bytes(photo()))]),
         holds="equals the processor", check=same_as_processor),
    Case("data_uri_png", one_image(lambda: data_uri(png_bytes(photo()))), holds="decoded, equals the processor",
         check=same_as_processor),
    Case("openai_image_url_item", lambda tmp: {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_uri(jpeg_bytes(photo()), "jpeg")}},
        {"type": "text", "text": "What is it?"}]}]}, holds="inline data: URI decoded", check=lambda r, row, p: r.validate()),
    Case("data_uri_bad_base64", one_image("data:image/png;base64,@@not-base64@@"), ImageError,
         ("base64 payload is invalid",), **IMG),
    Case("data_uri_not_base64", one_image("data:image/png,rawdata"), ImageError, ("unsupported data: URI",), **IMG),
    Case("http_url", one_image("https://example.com/cat.png"), ImageError, ("is a URL", "does not fetch"), **IMG),
    Case("images_not_a_list", lambda tmp: {**user_row([]), "images": {"bytes": png_bytes(photo()), "path": None}},
         ParseError, ("must hold a list of images", "wrap it"), err_stage="parse", column="images"),
    Case("messages_as_json_string", lambda tmp: {"messages": '[{"role": "user", "content": "hi"}]'}, ParseError,
         ("expected a non-empty list of chat messages", "json.loads"), err_stage="parse", column="messages"),
    # sizes
    Case("zero_pixel_array", one_image(np.zeros((0, 10, 3), np.uint8)), ImageError,
         ("0x10", "at least one pixel"), **IMG),
    Case("zero_pixel_pil", one_image(lambda: Image.new("RGB", (5, 0))), ImageError, ("0x5", "at least one pixel"), **IMG),
    Case("one_by_n", one_image(lambda: photo(1, 150)), holds="grid and pixels equal the processor's",
         check=same_as_processor),
    Case("n_by_one", one_image(lambda: photo(120, 1)), holds="grid and pixels equal the processor's",
         check=same_as_processor),
    Case("aspect_200", one_image(lambda: photo(1, 200)), holds="aspect 200 is allowed, as by the processor",
         check=same_as_processor),
    Case("aspect_201", one_image(lambda: photo(1, 201)), ImageError, ("aspect ratio 201.0", "at most 200", "crop or pad"),
         **IMG),
    Case("aspect_300_tall", one_image(lambda: photo(600, 2)), ImageError, ("aspect ratio 300.0",), **IMG),
    Case("far_above_max_pixels", one_image(lambda: smooth_gray(3000, 2000)),
         holds="resized to <= max_pixels, equals the processor", check=within_max_pixels),
    Case("decompression_bomb_header", one_image(lambda: png_header_only(20000, 20000)), ImageError,
         ("decompression-bomb limit", "MAX_IMAGE_PIXELS"), **IMG),
    # modes
    *[Case(f"mode_{m}", one_image(lambda m=m: photo().convert(m)), holds="equals the processor (RGB conversion)",
           check=same_as_processor) for m in ("L", "P", "1", "CMYK", "YCbCr", "I", "F")],
    Case("mode_RGBA", one_image(lambda: with_alpha(photo())), holds="alpha over white, equals the processor",
         check=same_as_processor),
    Case("mode_LA", one_image(lambda: with_alpha(photo()).convert("LA")), holds="equals the processor",
         check=same_as_processor),
    Case("palette_transparency_png", one_image(palette_with_transparency), holds="transparent index over white, "
         "equals the processor", check=same_as_processor),
    Case("cmyk_jpeg_bytes", one_image(lambda: jpeg_bytes(photo().convert("CMYK"))), holds="equals the processor",
         check=same_as_processor),
    Case("png_16bit_8bit_range", one_image(lambda: png_bytes(gray16(255).convert("I;16"))),
         holds="I;16 with values <= 255 equals the processor", check=same_as_processor),
    Case("png_16bit_full_range", one_image(lambda: png_bytes(gray16(65535))), ImageError,
         ("I;16", "clips them to 0..255", ">> 8"), layout="ok", **IMG),
    Case("gray_uint8_array", one_image(lambda: np.asarray(photo().convert("L"))), holds="equals the processor",
         check=same_as_processor),
    Case("float_array_nan", one_image(lambda: np.full((20, 20, 3), np.nan, np.float32)), ImageError,
         ("must be uint8", "dtype float32"), **IMG),
    Case("uint16_array", one_image(lambda: np.zeros((20, 20, 3), np.uint16)), ImageError, ("dtype uint16",), **IMG),
    Case("two_channel_array", one_image(lambda: np.zeros((20, 20, 2), np.uint8)), ImageError,
         ("[H, W, 1|3|4]", "shape (20, 20, 2)"), **IMG),
    Case("exif_rotated_jpeg", one_image(lambda: exif_jpeg(6)),
         holds="upright: equals the processor on the exif_transposed image", check=upright_as_processor),
    Case("exif_mirrored_jpeg", one_image(lambda: exif_jpeg(2)),
         holds="upright (mirrored back)", check=lambda r, row, p: upright_as_processor_same_grid(r, row, p)),
    # placeholders and messages
    Case("more_placeholders_than_images", lambda tmp: user_row([photo()], placeholders=2), PlaceholderError,
         ("row 7", "more image placeholders than the 1 image(s)"), err_stage="template", column="images"),
    Case("more_images_than_placeholders", lambda tmp: user_row([photo(), photo()], placeholders=1), PlaceholderError,
         ("row 7", "holds 2 image(s) but the messages hold 1 placeholder"), err_stage="template", column="images"),
    Case("prompt_placeholders_without_images", lambda tmp: {"prompt": "<image> and <image>", "images": [photo()]},
         PlaceholderError, ("more image placeholders",), err_stage="template", column="images"),
    Case("literal_image_pad_text", lambda tmp: user_row([photo()], text="see <|image_pad|>"), PlaceholderError,
         ("2 <|image_pad|> token(s) but the row has 1 image", "remove literal"), err_stage="template",
         column="messages"),
    Case("image_in_system_message", lambda tmp: {
        "messages": [{"role": "system", "content": [{"type": "image"}, {"type": "text", "text": "ref"}]},
                     {"role": "user", "content": "What is shown?"}], "images": [photo()]},
         holds="Qwen2-VL renders it: equals the processor", check=same_as_processor),
    Case("image_in_system_message_qwen3", lambda tmp: {
        "messages": [{"role": "system", "content": [{"type": "image"}, {"type": "text", "text": "ref"}]},
                     {"role": "user", "content": "What is shown?"}], "images": [photo()]},
         PlaceholderError, ("0 <|image_pad|> token(s) but the row has 1 image", "drops images in system messages"),
         err_stage="template", column="messages", family="qwen3_vl"),
    Case("image_in_assistant_message", lambda tmp: {
        "messages": [{"role": "user", "content": "Draw it."},
                     {"role": "assistant", "content": [{"type": "text", "text": "Here:"}, {"type": "image"}]}],
        "images": [photo()]}, holds="equals the processor; image tokens never labelled", check=image_tokens_unlabelled),
    Case("empty_message_list", lambda tmp: {"messages": [], "images": []}, ParseError,
         ("row 7", "expected a non-empty list of chat messages"), err_stage="parse", column="messages"),
    Case("no_messages_column", lambda tmp: {"text": "hi"}, ParseError, ("found columns ['text']", "'messages' column"),
         err_stage="parse"),
    Case("content_is_int", lambda tmp: {"messages": [{"role": "user", "content": 5}]}, ParseError,
         ("content must be a string or a list of items, found int",), err_stage="parse", column="messages"),
    Case("text_is_int", lambda tmp: {"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
         ParseError, ("text must be a string, found int", "str(x)"), err_stage="parse", column="messages"),
    Case("content_item_not_dict", lambda tmp: {"messages": [{"role": "user", "content": [3.5]}]}, ParseError,
         ("is not a dict",), err_stage="parse", column="messages"),
    Case("message_without_role", lambda tmp: {"messages": [{"content": "hi"}]}, ParseError,
         ("expected {'role', 'content'}",), err_stage="parse", column="messages"),
    Case("message_is_string", lambda tmp: {"messages": ["hello"]}, ParseError, ("expected {'role', 'content'}",),
         err_stage="parse", column="messages"),
    Case("unknown_role", lambda tmp: {"messages": [{"role": "narrator", "content": "hi"}]},
         holds="rendered by the template as given", check=lambda r, row, p: r.validate()),
    Case("video_item", lambda tmp: {"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}]},
         ParseError, ("video items are not supported",), err_stage="parse", column="messages"),
    Case("none_content", lambda tmp: {"messages": [{"role": "user", "content": None}]},
         holds="None content is empty text", check=lambda r, row, p: r.validate()),
    # truncation
    Case("too_long_raise", lambda tmp: user_row([photo()], text="word " * 50), TruncationError,
         ("exceed max_length=30", "truncation='drop'"), err_stage="truncate", column="input_ids",
         options={"max_length": 30}),
    Case("truncate_through_image", lambda tmp: user_row([photo()], text="x"), TruncationError,
         ("would cut into an image",), err_stage="truncate", column="input_ids",
         options={"max_length": 12, "truncation": "truncate_text"}),
    Case("truncate_text_after_image", lambda tmp: user_row([photo()], text="word " * 60),
         holds="cut to max_length, image tokens intact", check=truncated_text_only,
         options={"max_length": 40, "truncation": "truncate_text"}),
    # collate: pixel data vs grid, NaN/inf, dtypes, family, failed rows
    Case("pixel_bytes_short", mutate("uint8", _set("pixel_values_u8", lambda r: r["pixel_values_u8"][:-1000] + b"\xff")),
         PixelDataError, ("row 1, column 'pixel_values_u8'", "the pixel data and the grids disagree"),
         err_stage="collate", stage="collate"),
    Case("pixel_rows_vs_grid", mutate("float32", _set("pixel_values", lambda r: np.asarray(r["pixel_values"])[:-4])),
         PixelDataError, ("row 1, column 'pixel_values'", "expected shape"), err_stage="collate", stage="collate"),
    Case("grid_vs_image_tokens", mutate("float32", _grid_off_by_one), PixelDataError,
         ("row 1", "image tokens in input_ids but image_grid_thw"), err_stage="collate", stage="collate"),
    Case("nan_pixel_values", mutate("float32", lambda r: _float_pv(r, np.nan)), PixelDataError,
         ("row 1", "NaN or inf", "patch 3"), err_stage="collate", column="pixel_values", stage="collate"),
    Case("inf_pixel_values", mutate("float32", lambda r: _float_pv(r, -np.inf)), PixelDataError,
         ("row 1", "NaN or inf"), err_stage="collate", column="pixel_values", stage="collate"),
    Case("int_pixel_values", mutate("float32", _set("pixel_values", lambda r: np.asarray(r["pixel_values"]).astype(np.int64))),
         PixelDataError, ("holds int64 values", "pixel_values_u8"), err_stage="collate", column="pixel_values",
         stage="collate"),
    Case("float_input_ids", mutate("uint8", _set("input_ids", lambda r: np.asarray(r["input_ids"], np.float32))),
         InputError, ("input_ids holds float32", "int64"), err_stage="collate", column="input_ids", stage="collate"),
    Case("int64_pixel_values_u8", mutate("uint8", _set("pixel_values_u8", lambda r: np.zeros((4, 10), np.int64))),
         PixelDataError, ("pixel_values_u8 holds int64",), err_stage="collate", column="pixel_values_u8", stage="collate"),
    Case("float64_pixel_values", mutate("float32", _set("pixel_values", lambda r: np.asarray(r["pixel_values"], np.float64))),
         holds="cast to float32, equal to the float32 rows' batch", stage="collate", check=lambda b, rows, p: float32_batch(b, rows, p)),
    Case("family_mismatch_qwen3_collator", mutate("uint8", lambda r: None), FamilyMismatchError,
         ("row 0", "encoded for model family 'qwen2_vl' but this batch is for 'qwen3_vl'", "re-encode"),
         err_stage="collate", column="family", stage="collate", family="qwen3_vl"),
    Case("family_mismatch_qwen2_5_collator", mutate("uint8", lambda r: None), FamilyMismatchError,
         ("'qwen2_vl' but this batch is for 'qwen2_5_vl'",), err_stage="collate", column="family", stage="collate",
         family="qwen2_5_vl"),
    Case("mixed_families_in_batch", lambda tmp: encoded_rows("qwen2_vl", n=1) + encoded_rows("qwen3_vl", n=1),
         FamilyMismatchError, ("row 1", "'qwen3_vl'"), err_stage="collate", column="family", stage="collate"),
    Case("failed_row_in_batch", mutate("uint8", _failed_row), InputError,
         ("row 1", "failed to encode", "mmpipe.drop_failed"), err_stage="collate", column="mmpipe_error",
         stage="collate"),
    Case("empty_batch", lambda tmp: [], InputError, ("empty list of rows",), err_stage="collate", stage="collate"),
]


def upright_as_processor_same_grid(result, row, processor) -> None:
    """Mirror orientations keep the grid; the pixels are the mirrored-back image's."""
    img = _pil(row["images"][0])
    ref = processor_pixels(processor, [ImageOps.exif_transpose(img)])
    np.testing.assert_array_equal(result.image_grid_thw, ref["image_grid_thw"])
    np.testing.assert_array_equal(result.pixel_values, ref["pixel_values"])
    raw = processor_pixels(processor, [_pil(row["images"][0])])
    assert not np.array_equal(raw["pixel_values"], ref["pixel_values"])


def float32_batch(batch, rows, processor) -> None:
    import torch

    ref = mmpipe.Collator(processor)([{**r, "pixel_values": np.asarray(r["pixel_values"], np.float32)} for r in rows])
    assert batch.pixel_values.dtype == torch.float32
    assert torch.equal(batch.pixel_values, ref.pixel_values)


def case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)
