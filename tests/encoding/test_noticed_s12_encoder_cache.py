"""``mmpipe.encode``'s per-process encoders let a dropped processor go. Before, the cache held each
encoder, and so its processor and tokenizer, until 17 entries had piled up: a loop that builds a
processor per job kept every one of them alive (5 jobs: 5 processors still alive after gc)."""

from __future__ import annotations

import gc
import weakref

import pytest

import mmpipe
from mmpipe import testing
from mmpipe.encoding import dataset as encoding_dataset
from mmpipe.offline.other_vlms import build_foreign_processor
from mmpipe.offline.tokenizer import build_tokenizer


def _row(image=None) -> dict:
    user = [{"type": "image"}] if image is not None else []
    return {"messages": [{"role": "user", "content": user + [{"type": "text", "text": "hi"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}],
            "images": [image] if image is not None else []}


@pytest.fixture(scope="module")
def photo():
    return testing.sample_photos()[0][1].resize((56, 42))


BUILDERS = {
    "qwen2_vl": lambda: testing.build_processor("qwen2_vl"),
    "llava (generic path)": lambda: build_foreign_processor("llava"),
    "a tokenizer": lambda: build_tokenizer("qwen2_vl"),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_processor_per_job_is_not_kept_alive(name, photo):
    refs = []
    for _ in range(3):
        p = BUILDERS[name]()
        row = _row(None if name == "a tokenizer" else photo)
        out = mmpipe.encode(row, processor=p)
        assert len(out["input_ids"]) > 0
        refs.append((weakref.ref(p), weakref.ref(getattr(p, "tokenizer", p))))
        del p, out
    gc.collect()
    assert [(r() is None, t() is None) for r, t in refs] == [(True, True)] * 3


def test_a_live_processor_keeps_its_encoder(photo):
    p = testing.build_processor("qwen2_vl")
    a = mmpipe.encode(_row(photo), processor=p)
    mine = encoding_dataset._ENCODERS[id(p)]
    enc = next(iter(mine.values()))
    b = mmpipe.encode(_row(photo), processor=p)
    assert list(mine.values()) == [enc] and enc.processor is p and enc.tokenizer is p.tokenizer
    assert list(a["input_ids"]) == list(b["input_ids"])
    mmpipe.encode(_row(photo), processor=p, max_length=4096)  # other options: a second encoder
    assert len(encoding_dataset._ENCODERS[id(p)]) == 2
    pid = id(p)
    del p, enc, mine
    gc.collect()
    assert pid not in encoding_dataset._ENCODERS
