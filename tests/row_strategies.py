"""Hypothesis strategies for raw chat rows and encoded rows (shared by every test module).

Images come from a small pool of deterministic generated images of assorted sizes and
modes, so examples stay fast while still covering odd aspect ratios, RGBA and grayscale.
"""

from __future__ import annotations

import functools

from hypothesis import strategies as st

from mmpipe import testing


@functools.lru_cache(maxsize=None)
def image_pool():
    sizes = [(28, 28), (40, 60), (64, 48), (90, 33), (57, 120), (100, 100), (30, 200)]
    modes = ["RGB", "RGB", "RGBA", "L", "RGB", "RGB", "RGB"]
    return [testing.tiny_image(h, w, seed=i, mode=m) for i, ((h, w), m) in enumerate(zip(sizes, modes))]


images = st.integers(0, 6).map(lambda i: image_pool()[i])
words = st.text(alphabet="abcdefgh ijklmnop?!.", min_size=1, max_size=24)


@st.composite
def user_content(draw, max_images: int = 3):
    """A user content list: text and image placeholders in random order, plus its images."""
    n_img = draw(st.integers(0, max_images))
    items = [{"type": "text", "text": draw(words)} for _ in range(draw(st.integers(1, 2)))]
    for _ in range(n_img):
        items.insert(draw(st.integers(0, len(items))), {"type": "image"})
    # two images with no text between them crash transformers' get_rope_index; keep a
    # text item between images (real chat data has separators anyway)
    fixed = []
    for it in items:
        if fixed and it["type"] == "image" and fixed[-1]["type"] == "image":
            fixed.append({"type": "text", "text": " "})
        fixed.append(it)
    imgs = [draw(images) for _ in range(n_img)]
    return fixed, imgs


@st.composite
def raw_rows(draw, max_turns: int = 2, max_images: int = 3, assistant: bool | None = None):
    """A Hub-convention raw row {"messages", "images"} with 1..max_turns user turns."""
    turns = draw(st.integers(1, max_turns))
    msgs, all_imgs = [], []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(words)})
    for t in range(turns):
        content, imgs = draw(user_content(max_images))
        msgs.append({"role": "user", "content": content})
        all_imgs += imgs
        last = t == turns - 1
        with_answer = (not last) or (draw(st.booleans()) if assistant is None else assistant)
        if with_answer:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": draw(words)}]})
    return {"messages": msgs, "images": all_imgs}
