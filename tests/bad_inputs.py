"""The bad-input corpus: every case builds its own input (nothing is downloaded) and states
its expected outcome - success with what must hold, or an error class, stage, column and
message substrings. ``tests/test_bad_inputs.py`` runs every case; the fuzz tests reuse the
builders.

A case runs through one public stage:
- ``"encode"``: ``mmpipe.encode_row(row, processor, idx=ROW, pixels="float32", **options)``
  and again layout-only (``pixels="none"``), which must agree (same grid, or same error;
  ``layout="ok"`` where the failure is in pixel data a header-only read cannot see; ``"skip"``
  where the kind has no layout-only route: the generic path);
- ``"collate"``: ``mmpipe.Collator(processor)(rows)`` over rows built by ``build``, the bad
  one at batch index ``BAD``;
- ``"setup"``: ``mmpipe.Encoder(processor, **options)`` then one row encoded: a processor or
  options no row can be encoded with (an `ArgumentError` at once, whatever ``on_error``);
- ``"validate"``: ``mmpipe.validate_dataset(Dataset.from_list(rows))`` (the check reads the report);
- ``"stream"``: ``mmpipe.data.streaming.encode_stream(stream, processor, errors=errs, **options)``
  iterated to the end: ``check((rows, errs), stream, processor)``, or the error it raises;
- ``"dataset"``: ``mmpipe.encode_dataset(ds, processor, **options)``: ``check((enc, report), ds, processor)``.

Encode cases run under `bounded` (a FIFO or device path must fail, never hang); ``env`` sets
environment variables for a case. `outcome_counts` tallies the outcomes (the report table).
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
    ArgumentError,
    AudioError,
    FamilyMismatchError,
    ImageError,
    InputError,
    ParseError,
    PixelDataError,
    PlaceholderError,
    TruncationError,
    VideoError,
)
from mmpipe.testing import tiny_image

from helpers import FIFOS

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
    env: dict = field(default_factory=dict)  # environment variables set while the case runs
    processor: Optional[Callable[[], Any]] = None  # builds the processor (default: processor_for(family))

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
def omni():
    """Qwen2.5-Omni's thinker processor (the generic path with audio), built once."""
    if "omni" not in _OMNI:
        from mmpipe.offline.qwen_omni import build_processor

        _OMNI["omni"] = build_processor()
    return _OMNI["omni"]


_OMNI: dict = {}


CASES: list[Case] = [
    # bytes and paths
    Case("corrupt_bytes", one_image(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4), ImageError,
         ("row 7, image 0", "cannot read the image"), **IMG),
    Case("random_bytes", one_image(np.random.default_rng(0).bytes(500)), ImageError, ("cannot read the image",), **IMG),
    Case("empty_bytes", one_image(b""), ImageError, ("cannot read the image",), **IMG),
    # a cut file: the layout route decodes a file that does not reach its end marker (a length filter
    # must not keep a row training fails on; tests/images/test_hunt_layout_cuts_images.py sweeps the cuts)
    Case("truncated_png", one_image(lambda: png_bytes(photo(64, 64))[:400]), ImageError,
         ("row 7, image 0", "cannot read the image", "truncated"), **IMG),
    Case("truncated_jpeg", one_image(lambda: (lambda b: b[: len(b) * 2 // 3])(jpeg_bytes(photo(64, 64)))), ImageError,
         ("cannot read the image", "truncated"), **IMG),
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
    Case("dict_bytes_not_bytes", one_image({"bytes": "a str", "path": None}), ImageError,
         ("'bytes' is not bytes", "store the encoded file's bytes"), **IMG),
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
    Case("png_16bit_full_range_tiled", one_image(lambda: png_bytes(gray16(65535))), ImageError,
         ("row 7, image 0: I;16", "clips them to 0..255"), layout="ok", family="gemma3", options={"pixels": "uint8"}, **IMG),
    Case("truncated_jpeg_lazy_pil", one_image(lambda: Image.open(io.BytesIO(  # opened, header intact, not decoded
        (lambda b: b[: len(b) * 2 // 3])(jpeg_bytes(photo(64, 64)))))), ImageError,
         ("row 7, image 0", "cannot read the image", "truncated"), **IMG),
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
         VideoError, ("video 0: video path 'v.mp4' is a missing path",), err_stage="image", column="videos"),
    Case("video_corrupt", lambda tmp: {"messages": [{"role": "user", "content": [{"type": "video"}]}],
                                       "videos": [b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8]},
         VideoError, ("video 0: the video container cannot be opened",), err_stage="image", column="videos"),
    Case("video_no_frames", lambda tmp: {"messages": [{"role": "user", "content": [{"type": "video"}]}],
                                         "videos": [{"frames": [], "fps": 2.0}]},
         VideoError, ("video 0: the video has no frames",), err_stage="image", column="videos"),
    Case("video_without_placeholder", lambda tmp: {"messages": [{"role": "user", "content": "hi"}],
                                                   "videos": [[np.zeros((28, 28, 3), np.uint8)] * 2]},
         PlaceholderError, ("holds 1 video(s) but the messages hold 0 placeholder(s)",), err_stage="template",
         column="videos"),
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


# ---- issue 15: more kinds of damaged data ----------------------------------------------
# One line per kind. Covered in depth elsewhere (not repeated here): dataset-level damage
# (truncated / bit-flipped Arrow shards, missing files, not-a-dataset paths) in
# tests/data/test_damaged.py; image_root confinement and the CLI route in
# tests/images/test_paths.py; option values and map routes in tests/encoding/test_hardening.py;
# inconsistent batches in tests/batching/test_unbatch_checks.py; FIFO / directory / device
# judge frames in tests/reward/test_frames_files.py.




def _fifo_path(tmp: Path) -> str:
    import os

    if not os.path.exists(tmp / "pipe.png"):  # cases build twice: pixels and layout-only
        os.mkfifo(tmp / "pipe.png")
    FIFOS.append(str(tmp / "pipe.png"))
    return str(tmp / "pipe.png")


def _socket_path(tmp: Path) -> str:
    import atexit
    import os
    import shutil
    import socket
    import tempfile

    d = tempfile.mkdtemp(prefix="mmpipe-corpus-", dir="/tmp")  # AF_UNIX paths are limited to ~100 bytes
    atexit.register(shutil.rmtree, d, True)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(os.path.join(d, "s.png"))  # the socket file stays after close
    return os.path.join(d, "s.png")


def _symlink(tmp: Path, target: Path, name: str) -> str:
    import os

    if not os.path.lexists(tmp / name):  # cases build twice: pixels and layout-only
        os.symlink(target, tmp / name)
    return str(tmp / name)


def _symlink_loop(tmp: Path) -> str:
    _symlink(tmp, tmp / "loop_b.png", "loop_a.png")
    return _symlink(tmp, tmp / "loop_a.png", "loop_b.png")


def _mkdir(tmp: Path) -> str:
    (tmp / "dir.png").mkdir(exist_ok=True)
    return str(tmp / "dir.png")


def path_image(make: Callable[[Path], str]) -> Callable[[Path], dict]:
    return lambda tmp: user_row([make(tmp)])


def encoded(fmt: str, **kw) -> Callable[[], bytes]:
    def build():
        buf = io.BytesIO()
        img = photo()
        if fmt == "GIF":  # three frames: the first one is the image, as PIL and the processor open it
            kw2 = {"save_all": True, "append_images": [photo(seed=2), photo(seed=3)]}
        else:
            kw2 = {}
        img.save(buf, fmt, **kw, **kw2)
        return buf.getvalue()
    return build


def chat(*messages, **extra) -> Callable[[Path], dict]:
    return lambda tmp: {"messages": list(messages), **extra}


def user(content) -> dict:
    return {"role": "user", "content": content}


def assistant_calls(calls) -> Callable[[Path], dict]:
    return chat(user("weather?"), {"role": "assistant", "content": "", "tool_calls": calls})


def decodes_to(needle: str) -> Callable:
    """The decoded input_ids hold ``needle`` exactly: the text reached the tokenizer unchanged."""
    def check(result, row, processor) -> None:
        result.validate()
        text = processor.tokenizer.decode(result.input_ids.tolist())
        assert needle in text, (needle, text)
    return check


def text_only(result, row, processor) -> None:
    result.validate()
    assert result.image_grid_thw is None or len(result.image_grid_thw) == 0


def one_image_grid(result, row, processor) -> None:
    result.validate()
    assert np.asarray(result.image_grid_thw).shape == (1, 3)


PARSE_M = dict(err_stage="parse", column="messages")
WEATHER = [{"type": "function", "function": {"name": "w", "arguments": {"city": "Oslo"}}}]
NOT_REGULAR = ("opens only regular files",)
CASES += [
    # image paths that are not image files (bounded: nothing may hang)
    Case("path_is_fifo", path_image(_fifo_path), ImageError, ("is a FIFO (named pipe)",) + NOT_REGULAR, **IMG),
    Case("path_is_directory", path_image(_mkdir), ImageError, ("is a directory", "point the path at an image file"),
         **IMG),
    Case("path_is_symlink_loop", path_image(_symlink_loop), ImageError, ("is a symlink loop", "fix the path"), **IMG),
    Case("path_is_char_device", path_image(lambda tmp: "/dev/zero"), ImageError,
         ("is a character device",) + NOT_REGULAR, **IMG),
    Case("path_is_socket", path_image(_socket_path), ImageError, ("is a socket",) + NOT_REGULAR, **IMG),
    Case("path_dangling_symlink", path_image(lambda tmp: _symlink(tmp, tmp / "gone.png", "link.png")), ImageError,
         ("no such file", "a dangling symlink"), **IMG),
    Case("path_oversized_file", lambda tmp: user_row([write(tmp, "big.png", png_bytes(photo(64, 64)))]), ImageError,
         ("more than the 100-byte limit", "MMPIPE_MAX_IMAGE_BYTES"), env={"MMPIPE_MAX_IMAGE_BYTES": "100"}, **IMG),
    Case("path_empty_string", one_image(""), ImageError, ("no such file",), **IMG),
    Case("path_pathlib_missing", lambda tmp: user_row([tmp / "nope.png"]), ImageError, ("no such file", "nope.png"),
         **IMG),
    # bytes that are some other file
    Case("svg_bytes", one_image(b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>'), ImageError,
         ("cannot read the image",), **IMG),
    Case("html_error_page_bytes", one_image(b"<html><body>404 Not Found</body></html>"), ImageError,
         ("cannot read the image",), **IMG),
    Case("pdf_bytes", one_image(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj"), ImageError, ("cannot read the image",), **IMG),
    Case("png_with_trailing_garbage", one_image(lambda: png_bytes(photo()) + b"garbage" * 100),
         holds="bytes after IEND ignored, equals the processor", check=same_as_processor),
    Case("two_pngs_concatenated", one_image(lambda: png_bytes(photo()) * 2),
         holds="the first image, equals the processor", check=same_as_processor),
    *[Case(f"format_{f.lower()}", one_image(encoded(f)), holds="equals the processor", check=same_as_processor)
      for f in ("WEBP", "BMP", "TIFF", "GIF", "ICO")],
    # arrays of the wrong shape or dtype
    Case("array_4d_video", one_image(lambda: np.zeros((2, 10, 10, 3), np.uint8)), ImageError,
         ("shape (2, 10, 10, 3)", "one image per array"), **IMG),
    Case("array_1d", one_image(lambda: np.zeros((10,), np.uint8)), ImageError, ("shape (10,)",), **IMG),
    Case("array_object_dtype", one_image(lambda: np.array([None, 1], dtype=object)), ImageError,
         ("found dtype object",), **IMG),
    Case("array_bool_dtype", one_image(lambda: np.zeros((10, 10, 3), bool)), ImageError, ("found dtype bool",), **IMG),
    Case("array_non_contiguous", one_image(lambda: np.asarray(photo(20, 60))[:, ::2]),
         holds="strided view read as is, equals the processor", check=same_as_processor),
    # images column and entries of the wrong type
    *[Case(f"image_entry_{n}", one_image(v), ImageError, (f"unsupported image value of type {t}",), **IMG)
      for n, v, t in (("none", None, "NoneType"), ("float", 1.5, "float"), ("bool", True, "bool"))],
    Case("image_entry_nested_list", lambda tmp: user_row([[png_bytes(photo())]]), ImageError,
         ("unsupported image value of type list",), **IMG),
    Case("image_dict_empty", one_image({}), ImageError, ("neither 'bytes' nor 'path'", "found keys []"), **IMG),
    Case("image_dict_extra_keys", one_image(lambda: {"bytes": png_bytes(photo()), "path": None, "exif": 1}),
         holds="extra keys ignored, equals the processor", check=same_as_processor),
    *[Case(f"images_column_{n}", lambda tmp, v=v: {**user_row([]), "images": v}, ParseError,
           ("must hold a list of images", f"found {t}", "wrap it"), err_stage="parse", column="images")
      for n, v, t in (("string", "a.png", "str"), ("bytes", b"\x89PNG", "bytes"), ("int", 3, "int"))],
    Case("images_column_none_with_placeholder", lambda tmp: {**user_row([]), "images": None,
         "messages": [user([{"type": "image"}])]}, PlaceholderError, ("more image placeholders than the 0 image(s)",),
         err_stage="template", column="images"),
    Case("images_column_none_text_only", chat(user("hi"), images=None), holds="None images: a text-only row",
         check=text_only),
    Case("image_inline_in_item", chat(user([{"type": "image", "image": png_bytes(photo())},
                                            {"type": "text", "text": "what?"}])),
         holds="the item's own image is used", check=one_image_grid),
    # the messages column and its messages of the wrong type
    Case("messages_none", lambda tmp: {"messages": None}, ParseError, ("'messages' column",), err_stage="parse"),
    *[Case(f"messages_{n}", lambda tmp, v=v: {"messages": v}, ParseError,
           ("expected a non-empty list of chat messages",), **PARSE_M)
      for n, v in (("dict", {"role": "user", "content": "hi"}), ("int", 5))],
    Case("messages_nested_list", chat([user("hi")]), ParseError, ("message 0: expected {'role', 'content'}",),
         **PARSE_M),
    Case("message_none", chat(None), ParseError, ("message 0: expected {'role', 'content'}", "found None"), **PARSE_M),
    *[Case(f"role_{n}", chat(user("hi"), {"role": v, "content": "x"}), ParseError,
           ("message 1: role must be a non-empty string", "set every message's role"), **PARSE_M)
      for n, v in (("none", None), ("int", 5), ("empty", ""), ("list", ["user"]), ("dict", {"r": "user"}))],
    Case("role_uppercase", chat({"role": "USER", "content": "hi"}), holds="rendered by the template as given",
         check=decodes_to("USER")),
    *[Case(f"content_{n}", chat(user(v)), ParseError, (f"content must be a string or a list of items, found {t}",),
           **PARSE_M) for n, v, t in (("dict", {"type": "text", "text": "hi"}, "dict"), ("float", 1.5, "float"),
                                      ("bytes", b"hi", "bytes"))],
    Case("content_nested_list", chat(user([[{"type": "text", "text": "hi"}]])), ParseError,
         ("is not a dict", "wrap the item in a dict"), **PARSE_M),
    Case("text_none", chat(user([{"type": "text", "text": None}])), ParseError, ("has neither text nor an image",),
         **PARSE_M),
    *[Case(f"text_{n}", chat(user([{"type": "text", "text": v}])), ParseError, (f"text must be a string, found {n}",),
           **PARSE_M) for n, v in (("list", ["a", "b"]), ("dict", {"a": 1}))],
    Case("item_type_audio", chat(user([{"type": "audio", "audio": "x.wav"}])), ParseError,
         ("1 audio clip(s)", "takes no audio", "Qwen2.5-Omni"), err_stage="parse", column="audios"),
    *[Case(f"omni_audio_{name}", lambda tmp, v=value: {"messages": [user([{"type": "audio"}, {"type": "text", "text": "?"}])],
                                                       "audios": [v]}, AudioError, words, err_stage="audio",
           column="audios", layout="skip", processor=omni)
      for name, value, words in (
          ("bare_array", np.zeros(800, np.float32), ("must be a path", "sampling_rate")),
          ("corrupt_bytes", b"RIFF0000WAVEjunk", ("cannot be decoded",)),
          ("empty", {"array": np.zeros(0, np.float32), "sampling_rate": 16000}, ("no samples",)),
          ("nan", {"array": np.full(800, np.nan, np.float32), "sampling_rate": 16000}, ("NaN",)),
          ("over_30s", {"array": np.zeros(16000 * 31, np.float32), "sampling_rate": 16000}, ("would cut the rest",)),
      )],
    Case("item_without_type", chat(user([{"text": "untyped words"}])), holds="an item with text is a text item",
         check=decodes_to("untyped words")),
    Case("item_type_none", chat(user([{"type": None, "text": "none typed"}])), holds="an item with text is a text item",
         check=decodes_to("none typed")),
    # prompt / completion columns of the wrong type
    Case("prompt_none", lambda tmp: {"prompt": None}, ParseError, ("'prompt' column",), err_stage="parse"),
    *[Case(f"prompt_{n}", lambda tmp, v=v: {"prompt": v}, ParseError, ("expected a non-empty list of chat messages",),
           err_stage="parse", column="prompt") for n, v in (("int", 5), ("dict", {"text": "hi"}))],
    Case("prompt_as_message_list", lambda tmp: {"prompt": [user("listed prompt")]},
         holds="a message list in 'prompt' is a conversation", check=decodes_to("listed prompt")),
    Case("messages_and_prompt_both", lambda tmp: {"messages": [user("describe")], "prompt": "what is this?"},
         ParseError, ("'prompt'", "drop one"), **PARSE_M),
    Case("completion_list_of_strings", lambda tmp: {"prompt": "hi", "completion": ["a", "b"]}, ParseError,
         ("expected {'role', 'content'}",), err_stage="parse", column="completion"),
    Case("completion_int", lambda tmp: {"prompt": "hi", "completion": 5}, ParseError,
         ("neither text nor chat messages", "give the assistant reply as a string"), err_stage="parse",
         column="completion"),
    Case("row_none", lambda tmp: None, ParseError, ("a row must be a dict", "pass one row (a dict)"), err_stage="parse"),
    Case("row_list", lambda tmp: [1, 2], ParseError, ("a row must be a dict", "found list"), err_stage="parse"),
    Case("row_str", lambda tmp: "describe it", ParseError, ("a row must be a dict", "found str"), err_stage="parse"),
    Case("completion_none", lambda tmp: {"prompt": "prompt only", "completion": None},
         holds="None completion: the prompt alone", check=decodes_to("prompt only")),
    Case("completion_as_messages", lambda tmp: {"prompt": [user("q?")], "completion": [
        {"role": "assistant", "content": "the answer"}]}, holds="conversational prompt + completion",
         check=decodes_to("the answer")),
    # tools and tool calls of the wrong type
    Case("tools_plain_string", chat(user("hi"), tools="get_weather"), ParseError, ("is not JSON", "json.dumps(tools)"),
         err_stage="parse", column="tools"),
    *[Case(f"tools_{n}", chat(user("hi"), tools=v), ParseError, ("must hold a list of tool specs",),
           err_stage="parse", column="tools")
      for n, v in (("dict", {"type": "function", "function": {"name": "w"}}), ("int", 5), ("list_of_int", [1, 2]))],
    Case("tools_json_string", chat(user("tool json"), tools='[{"type": "function", "function": {"name": "w"}}]'),
         holds="a JSON string of tools is parsed", check=decodes_to("tool json")),
    Case("tools_none", chat(user("no tools"), tools=None), holds="None tools: none", check=decodes_to("no tools")),
    *[Case(f"tool_calls_{n}", assistant_calls(v), ParseError, ("tool_calls must be a list", "wrap a single call"),
           **PARSE_M) for n, v in (("string", "w()"), ("dict", WEATHER[0]))],
    Case("tool_calls_item_int", assistant_calls([5]), ParseError, ("tool call 0: not a dict",), **PARSE_M),
    Case("tool_calls_arguments_bad_json", assistant_calls(
        [{"type": "function", "function": {"name": "w", "arguments": '{"city": '}}]), ParseError,
         ("tool call 0: arguments is not a JSON object string",), **PARSE_M),
    Case("tool_calls_arguments_json_string", assistant_calls(
        [{"type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}}]),
         holds="JSON-string arguments are parsed", check=decodes_to("weather?")),
    Case("tool_calls_none", chat(user("q"), {"role": "assistant", "content": "plain answer", "tool_calls": None}),
         holds="None tool_calls: none", check=decodes_to("plain answer")),
    # Unicode
    Case("surrogate_in_prompt", lambda tmp: {"prompt": "ab\ud800c"}, ParseError,
         ("lone UTF-16 surrogate", "character 2"), err_stage="parse", column="prompt"),
    Case("surrogate_in_text_item", chat(user([{"type": "text", "text": "x\udfff"}])), ParseError,
         ("lone UTF-16 surrogate", "character 1"), **PARSE_M),
    Case("surrogate_in_completion", lambda tmp: {"prompt": "fine", "completion": "\ud83d oops"}, ParseError,
         ("lone UTF-16 surrogate", "character 0"), err_stage="parse", column="completion"),
    Case("surrogate_in_role", chat({"role": "us\ud800er", "content": "hi"}), ParseError,
         ("lone UTF-16 surrogate", "the rendered prompt"), err_stage="parse"),
    *[Case(f"unicode_{n}", lambda tmp, s=s: {"prompt": s}, holds="passed to the tokenizer unchanged",
           check=decodes_to(s)) for n, s in (
        ("nul", "a\x00b"), ("rtl_override", "abc \u202eevil\u202c \u200fx"),
        ("zero_width_joiner", "\U0001f468\u200d\U0001f469\u200d\U0001f467 family"),
        ("bom", "\ufeffhello"),
        ("noncharacters", "\uffff and \U0010ffff"), ("whitespace_only", "   \n\t "))],
    Case("unicode_combining_marks", lambda tmp: {"prompt": "e\u0301 n\u0303 a" + "\u0300" * 50},
         holds="NFC-normalized by the tokenizer, as by the processor",
         check=decodes_to("\u00e9 \u00f1 \u00e0" + "\u0300" * 49)),
]


# ---- issue 29: the new surfaces (generic path, streaming, source rows, mixed families) ------
_PROCS: dict = {}


def llava(px: int = 32, template: bool = True):
    """A LLaVA processor (the generic path) whose image processor resizes and crops to ``px``."""
    def build():
        key = (px, template)
        if key not in _PROCS:
            from mmpipe.offline.other_vlms import build_foreign_processor

            p = build_foreign_processor("llava")
            p.image_processor.size = {"shortest_edge": px}
            p.image_processor.crop_size = {"height": px, "width": px}
            if not template:
                p.chat_template = None
            _PROCS[key] = p
        return _PROCS[key]
    return build


def generic_rows(*sizes: int) -> Callable[[Path], list]:
    """One stored row per LLaVA image setting in ``sizes`` (row i encoded by a ``sizes[i]``-px processor)."""
    return lambda tmp: [mmpipe.encode_row(user_row([photo(40, 60, seed=i)]), llava(px)(), idx=i).to_dict()
                        for i, px in enumerate(sizes)]


def layout_issue_rows(rows: list):
    def check(report, data, processor) -> None:
        errs = [i for i in report.errors if i.column == "generic_layout"]
        assert len(errs) == 1 and errs[0].rows == rows and "image-processor settings" in errs[0].message, report
        assert not report.ok
    return check


def family_rows(*families: str) -> Callable[[Path], list]:
    from conftest import processor_for

    return lambda tmp: [mmpipe.encode_row(user_row([photo(30 + 8 * i, 40, seed=i)]), processor_for(f), idx=i).to_dict()
                        for i, f in enumerate(families)]


def image_stream(values: list, *, placeholders: Optional[list] = None):
    """A stream (``IterableDataset``) of one-image rows over a decoding ``Sequence(Image())`` column,
    as ``load_dataset(..., streaming=True)`` gives it; ``values``: each row's image bytes."""
    def build(tmp):
        import datasets

        feats = datasets.Features({
            "messages": [{"role": datasets.Value("string"),
                          "content": [{"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
            "images": datasets.Sequence(datasets.Image()),
        })
        rows = []
        for i, v in enumerate(values):
            n = 1 if placeholders is None else placeholders[i]
            content = [{"type": "image", "text": None}] * n + [{"type": "text", "text": "Describe."}]
            rows.append({"messages": [{"role": "user", "content": content}], "images": [{"bytes": v, "path": None}]})
        ds = datasets.Dataset.from_list(rows, features=feats)
        assert ds.features["images"].feature.decode
        return ds.to_iterable_dataset()
    return build


def stream_skipped(failed: dict):
    """Stream skip holds: the failed rows (``{row: stage}``) are out of the stream and in the
    errors list, every other row is there, equal to its own encode, and the rows collate."""
    def check(result, stream, processor) -> None:
        import datasets

        rows, errors = result
        assert {e["row"]: e["stage"] for e in errors} == failed
        assert all(e["column"] == "images" and e["reason"].startswith(f"row {e['row']}") for e in errors)
        raw = list(stream.cast_column("images", datasets.Sequence(datasets.Image(decode=False))))
        good = [i for i in range(len(raw)) if i not in failed]
        assert len(rows) == len(good) and all(len(r["input_ids"]) > 0 for r in rows)
        assert "mmpipe_error" not in rows[0]
        for r, i in zip(rows, good):
            assert np.asarray(r["input_ids"]).tolist() == mmpipe.encode_row(raw[i], processor, idx=i).input_ids.tolist()
        mmpipe.Collator(processor)(rows)
    return check


def map_keeps_failed(row: int):
    """``undecoded_stream(ds).map(mmpipe.encode, on_error="skip")`` (the plain map route on a
    stream, its Image() column read undecoded): the failed row stays, its error recorded, and the
    Collator refuses it."""
    def check(result, stream, processor) -> None:
        import json

        rows = result
        errs = {i: json.loads(r["mmpipe_error"]) for i, r in enumerate(rows) if r["mmpipe_error"]}
        assert list(errs) == [row] and errs[row]["stage"] == "image" and errs[row]["row"] == row
        try:
            mmpipe.Collator(processor)(rows)
        except InputError as e:
            assert e.row == row and "failed to encode" in str(e)
        else:
            raise AssertionError("a failed row was collated")
    return check


def turns(n: int) -> Callable[[Path], dict]:
    """A text row of ``n`` messages (user / assistant in turn): labels on every reply."""
    def build(tmp):
        msgs = []
        for i in range(n // 2):
            msgs += [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
        return {"messages": msgs}
    return build


def every_reply_labelled(n_replies: int):
    def check(result, row, processor) -> None:
        result.validate()
        tok = processor.tokenizer
        text = tok.decode(result.labels[result.labels != -100].tolist())
        assert text.count("answer ") == n_replies and f"answer {n_replies - 1}" in text
        assert "question" not in text
    return check


def reply_after_cut(tmp) -> "Any":
    import datasets

    long_prompt = [{"role": "user", "content": "word " * 60}, {"role": "assistant", "content": "the answer"}]
    short = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the answer"}]
    return datasets.Dataset.from_list([{"messages": short}, {"messages": long_prompt}, {"messages": short}])


def failed_untrained(result, ds, processor) -> None:
    """The row whose replies lie past the cut is recorded (stage truncate, column labels) and
    counted; the others keep their trained tokens."""
    enc, report = result
    assert [(e["row"], e["stage"], e["column"]) for e in report.errors] == [(1, "truncate", "labels")]
    assert report.rows_out == 2 and len(enc) == 2
    assert all(any(x != -100 for x in r) for r in enc["labels"])


def _fail(why: str) -> None:
    raise AssertionError(why)


def truncated(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


SRC = dict(options={"pixels": "source"})  # a cut file: the layout route refuses it too (it decodes cut files)
CASES += [
    # the generic path: rows of other image settings, unreadable files, no chat template, videos
    Case("generic_rows_of_other_image_settings", generic_rows(32, 48), InputError,
         ("row 1", "other image-processor settings", '"shortest_edge": 48', "re-encode this row"),
         err_stage="collate", column="generic_layout", stage="collate", processor=llava(32)),
    Case("generic_other_settings_middle_row", generic_rows(32, 48, 32), InputError,
         ("row 1", "other image-processor settings"), err_stage="collate", column="generic_layout",
         stage="collate", processor=llava(32)),
    Case("generic_other_settings_validate", generic_rows(32, 48), stage="validate", processor=llava(32),
         holds="validate_dataset: an error naming row 1 and the settings", check=layout_issue_rows([1])),
    Case("generic_same_settings_collate", generic_rows(32, 32, 32), stage="collate", processor=llava(32),
         holds="rows of one setting collate", check=lambda b, rows, p: b.vision["pixel_values"].shape[0] == 3),
    Case("generic_truncated_png", one_image(lambda: png_bytes(photo(64, 64))[:400]), ImageError,
         ("row 7, image 0", "cannot read the image", "truncated"), layout="skip", processor=llava(32), **IMG),
    Case("generic_corrupt_bytes", one_image(b"\x89PNG\r\n\x1a\n" + bytes(range(256))), ImageError,
         ("row 7, image 0", "cannot read the image"), layout="skip", processor=llava(32), **IMG),
    Case("generic_zero_pixel_image", one_image(lambda: Image.new("RGB", (5, 0))), ImageError,
         ("row 7, image 0", "0x5", "at least one pixel"), layout="skip", processor=llava(32), **IMG),
    Case("generic_16bit_full_range", one_image(lambda: png_bytes(gray16(65535))), ImageError,
         ("row 7, image 0: I;16", "clips them to 0..255"), layout="skip", processor=llava(32), **IMG),
    Case("generic_no_chat_template_skip", lambda tmp: user_row([photo()]), ArgumentError,
         ("LlavaProcessor has no chat template", "processor.chat_template", "chat_template_kwargs"),
         err_stage="argument", stage="setup", options={"on_error": "skip"}, processor=llava(32, template=False)),
    Case("generic_video_rows", lambda tmp: {"messages": [user([{"type": "video"}, {"type": "text", "text": "what?"}])],
                                            "videos": [[np.zeros((28, 28, 3), np.uint8)] * 2]}, ParseError,
         ("LlavaProcessor on the generic path takes images only", "drop the row's videos", "qwen2_vl"),
         err_stage="parse", column="videos", layout="skip", processor=llava(32)),
    Case("video_rows_on_image_only_family", lambda tmp: {
        "messages": [user([{"type": "video"}, {"type": "text", "text": "what?"}])],
        "videos": [[np.zeros((28, 28, 3), np.uint8)] * 2]}, ParseError,
         ("takes images only", "drop the row's videos", "a family that takes videos (qwen2_vl"),
         err_stage="parse", column="videos", family="gemma3", options={"pixels": "uint8"}),
    # streaming over a decoding Image() column, a corrupt image in the middle
    Case("stream_corrupt_image_skip", image_stream([png_bytes(photo()), b"not an image", png_bytes(photo(50, 30))]),
         stage="stream", options={"on_error": "skip"}, holds="skipped: out of the stream, its error kept and counted",
         check=stream_skipped({1: "image"})),
    Case("stream_corrupt_image_and_placeholder_skip", image_stream(
        [png_bytes(photo()), b"junk", png_bytes(photo(50, 30)), png_bytes(photo())], placeholders=[1, 1, 2, 1]),
         stage="stream", options={"on_error": "skip", "batch_size": 2},
         holds="every failed row skipped and counted, across batches",
         check=stream_skipped({1: "image", 2: "template"})),
    Case("stream_tiled_family_skip", image_stream([png_bytes(photo()), b"not an image", png_bytes(photo(50, 30))]),
         stage="stream", options={"on_error": "skip"}, family="gemma3",
         holds="a tiled family's stream: its own columns, the failed row skipped and counted",
         check=stream_skipped({1: "image"})),
    Case("stream_generic_path_skip", image_stream([png_bytes(photo()), b"not an image", png_bytes(photo(50, 30))]),
         stage="stream", options={"on_error": "skip"}, processor=llava(32),
         holds="the generic path's stream: its processor's columns, the failed row skipped and counted",
         check=stream_skipped({1: "image"})),
    Case("stream_corrupt_image_raise", image_stream([png_bytes(photo()), b"not an image", png_bytes(photo())]),
         ImageError, ("row 1, image 0", "cannot read the image"), stage="stream", **IMG),
    Case("stream_plain_map_undecoded_skip", image_stream([png_bytes(photo()), png_bytes(photo()), b"junk"]),
         stage="stream", options={"route": "map", "on_error": "skip"},
         holds="undecoded_stream(ds).map(mmpipe.encode): the failed row kept with its error, refused by collate",
         check=map_keeps_failed(2)),
    # pixels="source": a file cut short after its header fails at encode, not in a collate worker
    Case("source_truncated_png", one_image(lambda: png_bytes(photo(64, 64))[:400]), ImageError,
         ("row 7, image 0", "cannot read the image", "truncated"), **SRC, **IMG),
    Case("source_truncated_jpeg", one_image(lambda: truncated(jpeg_bytes(photo(64, 64)))), ImageError,
         ("row 7, image 0", "cannot read the image"), **SRC, **IMG),
    Case("source_truncated_png_path", lambda tmp: user_row([write(tmp, "cut.png", png_bytes(photo(64, 64))[:400])]),
         ImageError, ("row 7, image 0", "cannot read the image"), **SRC, **IMG),
    Case("source_truncated_png_tiled", one_image(lambda: png_bytes(photo(64, 64))[:400]), ImageError,
         ("row 7, image 0", "cannot read the image"), family="gemma3", **SRC, **IMG),
    Case("source_complete_png", one_image(lambda: png_bytes(photo(64, 64))), options={"pixels": "source"},
         holds="stored as its file, collates to the processor's pixels",
         check=lambda r, row, p: np.testing.assert_array_equal(mmpipe.Collator(p)([r.to_dict()]).pixel_values.numpy(),
                                                               processor_pixels(p, [_pil(row["images"][0])])["pixel_values"])),
    # mixed kinds of family: the row that differs is blamed
    Case("mixed_kinds_foreign_first_row", family_rows("qwen2_vl", "gemma3", "gemma3"), InputError,
         ("row 0", "found family 'qwen2_vl'", "tiled-family rows (the collator's family 'gemma3')"),
         err_stage="collate", column="family", stage="collate", family="gemma3"),
    Case("mixed_kinds_foreign_second_row", family_rows("qwen2_vl", "gemma3"), InputError,
         ("row 1", "found family 'gemma3'"), err_stage="collate", column="family", stage="collate"),
    # truncate_text leaving no trained token; very long conversations with labels
    Case("truncate_text_cuts_every_reply", lambda tmp: {"messages": [
        {"role": "user", "content": "word " * 60}, {"role": "assistant", "content": "the answer"}]}, TruncationError,
         ("exceed max_length=40", "would cut every trained token", "truncation='drop'"), err_stage="truncate",
         column="labels", options={"max_length": 40, "truncation": "truncate_text"}),
    Case("truncate_text_cuts_every_reply_skip", reply_after_cut, stage="dataset",
         options={"max_length": 40, "truncation": "truncate_text", "on_error": "skip"},
         holds="skipped and counted (stage truncate), never kept with 0 trained tokens", check=failed_untrained),
    Case("truncate_text_keeps_part_of_a_reply", lambda tmp: {"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "word " * 60}]},
         options={"max_length": 40, "truncation": "truncate_text"}, holds="cut to 40 tokens, trained tokens kept",
         check=lambda r, row, p: len(r.input_ids) == 40 and (r.labels != -100).any() or _fail("no trained token")),
    Case("ten_thousand_turns_with_labels", turns(10_000), holds="encodes within the hang bound, every reply labelled",
         check=every_reply_labelled(5_000)),
]


def outcome_counts(cases: Optional[list] = None) -> dict:
    """The corpus' outcomes by kind: ``{"kinds", "clear_error": {class: n}, "handled",
    "silent", "crash", "hang", "undocumented"}``. Every case either raises a documented error
    class with its stage and message words, or succeeds with a stated, checked property; a
    silent success, a crash (an untyped exception) or a hang fails its test, so those stay 0.
    ``undocumented``: cases stating no outcome (no words or no check) - must be 0."""
    from collections import Counter

    cases = CASES if cases is None else cases
    errors = Counter(c.raises.__name__ for c in cases if c.raises is not None)
    undocumented = [c.name for c in cases if (c.raises is None and (not c.holds or c.check is None))
                    or (c.raises is not None and (not c.contains or c.err_stage is None))]
    return {"kinds": len(cases), "clear_error": dict(sorted(errors.items())),
            "handled": sum(c.raises is None for c in cases), "silent": 0, "crash": 0, "hang": 0,
            "undocumented": undocumented}
