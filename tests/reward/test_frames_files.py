"""Judge frames given as paths that are not image files (issue 15), in the corpus' style:

- a FIFO, a directory, a character device (/dev/zero), an oversized file (over
  ``$MMPIPE_MAX_IMAGE_BYTES``) -> `encode_frame` raises `ImageError` [stage image] naming the
  path and what it is; `VLMJudge.ask` returns two invalid answers ("bad frame: ...") and sends
  nothing. Nothing may hang: before, a FIFO passed ``os.path.isfile`` racing a swap, and the
  unbounded ``open().read()`` read /dev/zero-like files forever.
- a regular file path -> the same frame as its bytes (unchanged).
"""

from __future__ import annotations

import os

import pytest

from mmpipe.errors import ImageError
from mmpipe.reward import JudgeClient, VLMJudge, encode_frame
from mmpipe.testing import tiny_image
from helpers import FIFOS, bounded


def _png(tmp, name="f.png") -> str:
    path = str(tmp / name)
    tiny_image(24, 32, seed=2).save(path, "PNG")
    return path


def _fifo(tmp) -> str:
    path = str(tmp / "pipe.png")
    os.mkfifo(path)
    FIFOS.append(path)
    return path


def _dir(tmp) -> str:
    (tmp / "d.png").mkdir()
    return str(tmp / "d.png")


KINDS = {
    "fifo": (_fifo, "is a FIFO"),
    "directory": (_dir, "is a directory"),
    "char_device": (lambda tmp: "/dev/zero", "is a character device"),
    "oversized": (_png, "more than the 100-byte limit"),
}


@pytest.mark.parametrize("wrap", ["path", "dict", "file_url"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_non_file_frame_is_an_image_error_not_a_hang(kind, wrap, tmp_path, monkeypatch):
    make, words = KINDS[kind]
    path = make(tmp_path)
    if kind == "oversized":
        monkeypatch.setenv("MMPIPE_MAX_IMAGE_BYTES", "100")
    value = {"path": path, "file_url": "file://" + path, "dict": {"bytes": None, "path": path}}[wrap]
    with pytest.raises(ImageError) as info:
        bounded(encode_frame, value)
    e = info.value
    assert e.stage == "image" and path in str(e) and words in str(e), str(e)


def test_judge_answers_invalid_and_sends_nothing(tmp_path):
    judge = VLMJudge(JudgeClient("http://127.0.0.1:9/v1", "judge-model", timeout_s=0.5, max_retries=0),
                     task="stack the red cube", primitives=["reach", "grasp"])
    try:
        answers = bounded(judge.ask, _fifo(tmp_path), "grasp")
    finally:
        judge.close()
    for a in (answers.action, answers.progress):
        assert a.error.startswith("bad frame: ") and "is a FIFO" in a.error, a.error
    s = judge.stats.snapshot()
    assert (s["queries"], s["invalid"], s["requests"]) == (2, 2, 0)


def test_regular_path_is_the_same_frame_as_its_bytes(tmp_path):
    path = _png(tmp_path)
    with open(path, "rb") as f:
        data = f.read()
    by_path, by_bytes = encode_frame(path), encode_frame(data)
    assert by_path == by_bytes and by_path.url.startswith("data:image/png;base64,")
    assert encode_frame({"bytes": None, "path": path}) == by_bytes == encode_frame("file://" + path)
