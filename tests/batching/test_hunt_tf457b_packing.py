"""GLM-4.1V packing WITHOUT ``model=`` on transformers 4.57 (scripts/envs/tf457.sh).

4.57's ``Glm4vTextModel`` raises on every pack's ``position_ids [4, 1, T]``
(tests/batching/test_tf457_packing.py). With ``model=`` the pack is refused (`check_packing`); without
it the family's rows used to pack with only the "layers not checked" warning, and the first training
step then failed in transformers with an untyped RuntimeError. When the installed transformers is 4.x
every GLM-4.1V / 4.5V model of the process is 4.x's class, so the version is known at pack time:
`mmpipe.batching.attention_layers.check_family_line` refuses with the same typed error.
"""

from __future__ import annotations

import pytest

import mmpipe
from mmpipe import testing
from mmpipe.compat import is_transformers_5
from mmpipe.errors import PackingUnsupportedError


def _rows(proc):
    rows = []
    for k, n in enumerate((0, 1)):
        images = [testing.tiny_image(40, 56 + 9 * k, seed=k)] * n
        raw = {"messages": [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": "hi?"}]},
                            {"role": "assistant", "content": [{"type": "text", "text": f"row {k}"}]}],
               "images": images}
        rows.append(mmpipe.encode_row(raw, proc))
    return rows


@pytest.mark.needs_env("tf457")
def test_glm4v_pack_without_model_is_refused_on_4x():
    """Before: pack(rows, processor=proc) and PackingCollator(proc) built the pack (a warning only);
    now both raise PackingUnsupportedError naming transformers>=5 and the padded collator."""
    assert not is_transformers_5()
    proc = testing.build_processor("glm4v")
    rows = _rows(proc)
    want = r"glm4v.*transformers 4\.57.*transformers>=5.*mmpipe\.Collator"
    with pytest.raises(PackingUnsupportedError, match=want):
        mmpipe.pack(rows, processor=proc)
    with pytest.raises(PackingUnsupportedError, match=want):
        mmpipe.PackingCollator(proc)
    with pytest.raises(PackingUnsupportedError, match=want):
        mmpipe.PackingCollator(family="glm4v")
    for family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):  # the families 4.57 packs still pack without model=
        p = testing.build_processor(family)
        assert mmpipe.pack(_rows(p), processor=p).num_rows == 2


def test_glm4v_packs_without_model_on_5x():
    """Guard (main env): on transformers 5 GLM-4.1V takes packed positions; the model-less pack builds."""
    if not is_transformers_5():
        pytest.skip("transformers 4.x refuses GLM-4.1V packs (the test above)")
    proc = testing.build_processor("glm4v")
    assert mmpipe.pack(_rows(proc), processor=proc).num_rows == 2
