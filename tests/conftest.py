"""Shared fixtures: real processors and tiny models for each family, built offline once."""

from __future__ import annotations

import functools
import logging

import pytest

from mmpipe import testing

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


@functools.lru_cache(maxsize=None)
def processor_for(family: str):
    return testing.build_processor(family)


@functools.lru_cache(maxsize=None)
def model_for(family: str):
    return testing.build_model(family)


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture
def processor(family):
    return processor_for(family)


@pytest.fixture
def model(family):
    return model_for(family)


@pytest.fixture(scope="session")
def photos():
    return [im for _, im in testing.sample_photos()]


@pytest.fixture(autouse=True)
def _quiet_transformers():
    logging.getLogger("transformers").setLevel(logging.ERROR)
