"""`MMPipeRLHFDataset` on encoded rows that failed under ``on_error="skip"`` (0 ``input_ids``, their
failure in ``mmpipe_error``): refused when verl reads the files, naming the rows and the fix.

Before the fix the over-long filter kept them (0 tokens fit every ``max_prompt_length``), and so did
a dataset without the filter: the dataset built, and verl's loop met the first failed row when its
batch came up (``verl_prompt_rows`` refusing it), possibly hours in.
"""

from __future__ import annotations

import datasets
import pytest

import mmpipe
from mmpipe.errors import InputError

from conftest import processor_for

pytestmark = pytest.mark.needs_env("verl")


def _source():
    """Row 1 holds two ``<image>`` and one image: it fails to encode."""
    return [{"prompt": [{"role": "user", "content": "<image>" * k + f"Which page answers question {i}?"}],
             "images": [mmpipe.testing.tiny_image(40, 56, seed=i) for _ in range(n)],
             "data_source": "toy", "extra_info": {"index": i, "split": "train"}}
            for i, (k, n) in enumerate([(1, 1), (2, 1), (0, 0)])]


@pytest.mark.parametrize("filter_overlong", [True, False])
def test_failed_encoded_rows_are_refused_when_the_files_are_read(tmp_path, filter_overlong):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import get_dataset_class

    import mmpipe.hosts.verl as host

    proc = processor_for("qwen2_vl")
    src = datasets.Dataset.from_list(_source())
    enc = src.map(mmpipe.encode, fn_kwargs={"processor": proc, "labels": False, "on_error": "skip"},
                  with_indices=True, remove_columns=["images"])
    assert [bool(x) for x in enc["mmpipe_error"]] == [False, True, False]
    enc.to_parquet(tmp_path / "enc.parquet")
    cls = get_dataset_class(OmegaConf.create({"custom_cls": {"path": host.__file__, "name": "MMPipeRLHFDataset"}}))
    cfg = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 4096, "filter_overlong_prompts":
                            filter_overlong, "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path / "c")})
    with pytest.raises(InputError, match="drop_failed") as e:
        cls(data_files=[str(tmp_path / "enc.parquet")], tokenizer=proc.tokenizer, processor=proc, config=cfg)
    assert e.value.row == 1 and e.value.column == "mmpipe_error" and "MMPipeRLHFDataset" in str(e.value)
    kept, _ = mmpipe.drop_failed(enc)
    kept.to_parquet(tmp_path / "kept.parquet")
    ds = cls(data_files=[str(tmp_path / "kept.parquet")], tokenizer=proc.tokenizer, processor=proc, config=cfg)
    assert len(ds) == 2 and ds[1]["extra_info"]["index"] == 2
