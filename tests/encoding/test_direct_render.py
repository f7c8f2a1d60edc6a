"""The direct chat-template render (`mmpipe.encoding.render._DirectRender`, issue 34): plain
conversations rendered with the processor's compiled template give exactly the processor's
``apply_chat_template`` text; anything else (tools, tool calls, reasoning fields, None values,
``image_url`` parts, template kwargs, a patched processor) goes through the processor's call."""

from __future__ import annotations

import functools

import pytest

import mmpipe
from mmpipe import testing
from mmpipe.encoding import render
from mmpipe.encoding.render import _DirectRender, _plain_conversation

FAMS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "gemma3", "internvl", "llava_onevision", "glm46v")


@functools.lru_cache(maxsize=None)
def _proc(family):
    return testing.build_processor(family)


def _convs() -> list:
    img = {"type": "image"}
    return [
        [{"role": "user", "content": "Hi"}],
        [{"role": "user", "content": [img, {"type": "text", "text": "What is it?"}]},
         {"role": "assistant", "content": [{"type": "text", "text": "A cat.\n\n"}]}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "a"}, img]},
         {"role": "assistant", "content": "\nOne."}, {"role": "user", "content": [img, img]},
         {"role": "assistant", "content": ""}],
        [{"role": "user", "content": [{"type": "text", "text": "  spaces  "}]},
         {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}],
    ]


def _processor_render(proc, convs, agp):
    out = proc.apply_chat_template([list(c) for c in convs], tokenize=False, add_generation_prompt=agp)
    return [out] if isinstance(out, str) else list(out)


@pytest.mark.parametrize("family", FAMS)
@pytest.mark.parametrize("agp", [False, True])
def test_direct_render_equals_the_processor_call(family, agp, monkeypatch):
    proc = _proc(family)
    enc = mmpipe.Encoder(proc, pixels="none")
    convs = [enc.template_messages(c, "row") for c in _convs()]
    try:
        want = _processor_render(proc, convs, agp)
    except Exception:  # noqa: BLE001 - a template that refuses one of these conversations
        convs = [c for c in convs if _renders(proc, c, agp)]
        want = _processor_render(proc, convs, agp)
    monkeypatch.setattr(_DirectRender, "_checked", {})  # no verdict yet: this call checks
    calls = []
    real = _DirectRender._template.__func__

    def counted(cls, enc_, target):
        got = real(cls, enc_, target)
        calls.append(got[0] is not None)
        return got

    monkeypatch.setattr(_DirectRender, "_template", classmethod(counted))
    assert enc.render_many(convs, agp) == want
    assert calls and calls[0], "the direct way was not taken for plain conversations"
    assert all(_DirectRender._checked.values())  # the first batch agreed with the processor
    assert enc.render_many(convs, agp) == want  # and after the check


def _renders(proc, conv, agp) -> bool:
    try:
        _processor_render(proc, [conv], agp)
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.parametrize("conv", [
    [{"role": "user", "content": "a", "name": "x"}],  # another key
    [{"role": "user", "content": None}],  # None: the processor drops the key
    [{"role": "assistant", "content": "a", "reasoning_content": "r"}],  # reasoning fields are aliased
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],  # converted by the processor
    [{"role": "user", "content": [{"type": "text", "text": 3}]}],  # not a string
    ({"role": "user", "content": "a"},),  # not a list
])
def test_other_conversations_are_not_plain(conv):
    assert not _plain_conversation(conv)
    assert _plain_conversation([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}]}])


def test_tools_kwargs_and_patched_processors_take_the_processor_call(monkeypatch):
    proc = _proc("qwen2_vl")
    conv = [{"role": "user", "content": "Hi"}]
    seen = []
    real = proc.apply_chat_template

    def counting(conversation, **kw):
        seen.append(kw)
        return real(conversation, **kw)

    enc = mmpipe.Encoder(proc, pixels="none")
    enc.render_many([conv], True)
    monkeypatch.setattr(proc, "apply_chat_template", counting)  # patched on the instance: its call is used
    assert enc.render_many([conv], True) == [real(conv, tokenize=False, add_generation_prompt=True)]
    assert len(seen) == 1
    monkeypatch.undo()
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
    with monkeypatch.context() as m:
        m.setattr(_DirectRender, "run", classmethod(lambda *a: pytest.fail("direct way taken")))
        enc.render_many([conv], True, tools)
        mmpipe.Encoder(proc, pixels="none", chat_template_kwargs={"foo": 1}).render_many([conv], True)


def test_a_disagreeing_render_turns_the_way_off(monkeypatch):
    proc = _proc("qwen2_vl")
    enc = mmpipe.Encoder(proc, pixels="none")
    conv = [{"role": "user", "content": "Hi"}]
    want = _processor_render(proc, [conv], False)
    monkeypatch.setattr(_DirectRender, "_checked", {})

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    wrong = ImmutableSandboxedEnvironment().from_string("not what the processor writes")
    monkeypatch.setattr(_DirectRender, "_compiled", {proc._resolve_chat_template(None): wrong})
    assert enc.render_many([conv], False) == want
    assert list(_DirectRender._checked.values()) == [False]
    assert render._DirectRender.run(enc, proc, [conv], False) is None
