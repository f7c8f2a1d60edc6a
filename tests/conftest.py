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


# ---- test environments ------------------------------------------------------------------
# Tests that need packages the main environment must not hold (vLLM with its torchvision
# folder, transformers 4.57, hosts whose pins clash with ours) carry
# ``@pytest.mark.needs_env("NAME")``. scripts/envs/NAME.sh builds that environment and runs
# pytest in it with MMPIPE_TEST_ENV=NAME. The main run (MMPIPE_TEST_ENV unset) deselects
# them (they run in their own environment, they are not skipped); an environment's run keeps
# its own marked tests and the unmarked files its script names.
def current_test_env() -> str:
    import os

    return os.environ.get("MMPIPE_TEST_ENV", "main")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_env(name, ...): runs only in the named test environment (scripts/envs/NAME.sh)"
    )


def pytest_collection_modifyitems(config, items):
    env = current_test_env()
    keep, drop = [], []
    for item in items:
        marks = list(item.iter_markers("needs_env"))
        if marks and not any(env in m.args for m in marks):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
