"""The model lines that arrived with transformers 5.25 (`mmpipe.offline.same_family_lines`: qwen4_exp,
cosmos3_omni, glm_ocr; and glmga's model type) on transformers 4.57 (scripts/envs/tf457.sh): a config
read as a dict resolves to its family (nothing of 4.57 is asked), and building one of them, or the
GLM-4.6V processor they ship, is an `ArgumentError` naming the missing class and the fix, not an
AttributeError from transformers. Guards: these held before this hunt too."""

from __future__ import annotations

import pytest

import mmpipe
from mmpipe.errors import ArgumentError
from mmpipe.offline.same_family_lines import LINES, build_line_model, build_line_processor

pytestmark = pytest.mark.needs_env("tf457")


@pytest.mark.parametrize("model_type,family", [("qwen4_exp", "qwen3_vl"), ("cosmos3_omni", "qwen3_vl"),
                                               ("glm_ocr", "glm46v"), ("glmga", "glm46v")])
def test_a_5_25_config_resolves_to_its_family_on_4_57(model_type, family):
    import transformers

    assert transformers.__version__.startswith("4.57")
    config = {"model_type": model_type, "vision_config": {"patch_size": 16}}
    assert mmpipe.family_of(config).name == family


@pytest.mark.parametrize("model_type", sorted(LINES))
def test_building_a_5_25_line_names_the_missing_class(model_type):
    for build in (build_line_model, build_line_processor):
        with pytest.raises(ArgumentError, match=f"has no {LINES[model_type][0]}.*install a transformers"):
            build(model_type)
    with pytest.raises(ArgumentError, match="Glm46VProcessor.*install transformers>=5"):
        mmpipe.testing.build_processor("glm46v")
