"""One render for a conversation's text and its replies (`mmpipe.encoding.marked_render`): the
text read off the marked render is used only where the template provably wrote each reply out
untouched. On templates that trim, split, measure, slice, compare, escape, format, concatenate
or repeat a reply, the encode still equals the two-render way (ids, labels), and the one-render
way is refused; on templates that only write replies out it is taken, with the same result."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import mmpipe
from mmpipe.encoding import marked_render
from mmpipe.encoding.marked_render import Probe, TrackedText, plain_text
from mmpipe.testing import build_processor

# a Qwen-style template whose assistant content is written by REPLY (the other roles plainly)
_BASE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% if message['role'] == 'assistant' %}REPLY{% else %}{{ text }}{% endif %}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}{% set text = part['text'] %}"
    "{% if message['role'] == 'assistant' %}REPLY{% else %}{{ text }}{% endif %}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
UNTOUCHED = {  # the reply written out as it is: one render (for how many conversations of 4)
    "plain": ("{{ text }}", 4),
    "attribute style, whitespace control": ("{{- text -}}", 4),
    # the truth value is the content's own: the reply whose first text part is empty loses its
    # start marker there (the part is not written), so that conversation takes two renders
    "truth value only": ("{% if text %}{{ text }}{% else %}(empty){% endif %}", 3),
}
TOUCHED = {  # the reply read or changed: two renders
    "trim": "{{ text | trim }}",
    "replace": "{{ text | replace('a', 'b') }}",
    "split at </think>": "{% if '</think>' in text %}{{ text.split('</think>')[-1] }}{% else %}{{ text }}{% endif %}",
    "length": "{% if text | length > 3 %}{{ text }}{% else %}short{% endif %}",
    "slice": "{{ text[:4] }}",
    "compare": "{% if text == 'A.' %}X{% endif %}{{ text }}",
    "printf precision": "{{ '%.3s' % text }}",
    "concatenated ~": "{{ 'x' ~ text }}",
    "concatenated +": "{{ 'x' + text }}",
    "json": "{{ text | tojson }}",
    "written twice": "{{ text }}{{ text }}",
    "upper": "{{ text | upper }}",
    "str.format": "{{ '[{}]'.format(text) }}",
    "startswith": "{% if text.startswith('A') %}!{% endif %}{{ text }}",
    "characters": "{% for ch in text %}{{ ch }}{% endfor %}",
    "json and plain": "{{ text }}{{ text | tojson }}",
    "escaped (read through str(): refused, though escaping would keep the markers)": "{{ text | e }}",
    "as a number": "{% if text | int == 0 %}{{ text }}{% endif %}",
    "json in a condition": "{% if (text | tojson) | length > 12 %}{{ text }}{% endif %}",
    # output captured into a value, changed after the reply was written into it
    "macro, its output stripped (Qwen3-VL)": "{% macro show(c) %}{{ c }}{% endmacro %}{{ show(text) | trim }}",
    "set block, trimmed": "{% set block %}{{ text }}{% endset %}{{ block | trim }}",
    "filter block": "{% filter trim %}{{ text }}{% endfilter %}",
}
CONVERSATIONS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "A. cat </think> done "}],
    [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "q"}]},
     {"role": "assistant", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "two parts"}]},
     {"role": "user", "content": "again"}, {"role": "assistant", "content": "\n  spaced\n"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "q2"},
     {"role": "assistant", "content": "x"}],
    [{"role": "user", "content": "q"}, *[m for k in range(12) for m in (
        {"role": "assistant", "content": f"reply {k}"}, {"role": "user", "content": f"turn {k}"})]],
]


@pytest.fixture(scope="module")
def processor():
    return build_processor("qwen2_vl")


def _encode(processor, template: str, one_render: bool, monkeypatch) -> tuple[list, int]:
    """(per conversation: ids and labels of the per-row and the batched path, how many
    conversations took the one-render way)."""
    taken = [0]

    def counted(marked, probe, replies):
        text = plain_text(marked, probe, replies) if one_render else None
        taken[0] += text is not None
        return text

    for module in ("mmpipe.encoding.render", "mmpipe.encoding.layout_batch"):
        monkeypatch.setattr(f"{module}.plain_text", counted)
    proc = copy.copy(processor)
    proc.chat_template = _BASE.replace("REPLY", template)
    enc = mmpipe.Encoder(proc, pixels="none")
    rows = [enc.encode_one({"messages": copy.deepcopy(c)}, i) for i, c in enumerate(CONVERSATIONS)]
    batch = enc({"messages": copy.deepcopy(CONVERSATIONS), "images": [[] for _ in CONVERSATIONS]})
    out = [(np.asarray(r["input_ids"]).tolist(), np.asarray(r["labels"]).tolist()) for r in rows]
    out += [(np.asarray(a).tolist(), np.asarray(b).tolist()) for a, b in zip(batch["input_ids"], batch["labels"])]
    return out, taken[0]


@pytest.mark.parametrize("name", sorted(UNTOUCHED))
def test_untouched_replies_take_one_render(processor, name, monkeypatch):
    template, n_one = UNTOUCHED[name]
    two, _ = _encode(processor, template, False, monkeypatch)
    one, taken = _encode(processor, template, True, monkeypatch)
    assert one == two
    assert taken == 2 * n_one  # on both paths
    assert any(any(x != -100 for x in labels) for _, labels in one)


@pytest.mark.parametrize("name", sorted(TOUCHED))
def test_touched_replies_take_two_renders(processor, name, monkeypatch):
    two, _ = _encode(processor, TOUCHED[name], False, monkeypatch)
    one, taken = _encode(processor, TOUCHED[name], True, monkeypatch)
    assert one == two
    assert taken == 0


def test_every_read_of_a_tracked_text_is_seen():
    names = [n for n in dir(str) if callable(getattr(str, n)) and n not in marked_render._PLUMBING]
    assert {"__str__", "__repr__", "__eq__", "__len__", "__getitem__", "__contains__", "__mod__", "__format__",
            "__iter__", "__hash__", "split", "strip", "replace", "__getnewargs__"} <= set(names)
    for name in names:
        probe = Probe()
        text = TrackedText("\x02mmpipeS0\x03abc", probe, True)
        try:
            getattr(text, name)(*{"__getitem__": (0,), "__contains__": ("a",), "__eq__": ("x",)}.get(name, ()))
        except TypeError:
            pass  # a method that needs arguments: the call was still seen
        assert probe.touched, name
    probe = Probe()
    assert not TrackedText("\x02mmpipeS0\x03", probe, False) and not probe.touched  # the content's own truth
    "x" + TrackedText("y", probe, True)
    assert probe.touched


def test_plain_text_refuses_what_it_cannot_prove():
    p = Probe()
    p.made = p.written = 2
    marked = "a\x02mmpipeS1\x03r1\x02mmpipeE1\x03b\x02mmpipeS3\x03r3\x02mmpipeE3\x03c"
    assert plain_text(marked, p, [1, 3]) == "ar1br3c"
    assert plain_text(marked, p, [1]) is None  # a marker of no reply
    assert plain_text(marked.replace("\x02mmpipeE3\x03", ""), p, [1, 3]) is None  # dropped
    assert plain_text(marked + '"\\u0002mmpipeS1\\u0003"', p, [1, 3]) is None  # an escaped copy
    assert plain_text(marked + "\x02", p, [1, 3]) is None
    p.written = 1  # one marked content not written out by the overlay (another renderer)
    assert plain_text(marked, p, [1, 3]) is None
    p.written = 3  # one written twice
    assert plain_text(marked, p, [1, 3]) is None
    p.written = 2
    p.touched = True
    assert plain_text(marked, p, [1, 3]) is None
