"""The shard errors rebuilt from their args (``type(e)(*e.args)``, what pickle's default and a
``datasets`` pool do) keep every field. Before, the message landed in ``shard`` and a new message
was composed around it: ``ShardReadError(*e.args).shard`` was the whole text, and a rebuilt
``DamagedShardError`` said ``shard "shard 's3://...' is damaged ..." is damaged: reading its footer``
with ``rows_read`` 0, ``row_group`` None and ``rows_readable`` None."""

from __future__ import annotations

import pytest

from mmpipe.data.object_store import DamagedShardError, ShardReadError

URL = "s3://b/part-2.parquet"
CASES = {
    "read": lambda: ShardReadError(URL, OSError("reset")),
    "row group, start": lambda: DamagedShardError(URL, rows_read=7, row_group=1, cause=OSError("bad page"), start=10),
    "row group": lambda: DamagedShardError(URL, rows_read=4, row_group=2, cause=ValueError("bad page")),
    "footer": lambda: DamagedShardError(URL, cause=OSError("cut short")),
    "none readable": lambda: DamagedShardError(URL, detail=f"none of the 3 shards can be read (the last: {URL!r})",
                                               found="3 unreadable shards"),
}


def _fields(e: BaseException) -> dict:
    return {k: v for k, v in vars(e).items() if k not in ("where", "worker_text")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rebuilt_from_args_keeps_the_message_and_every_field(case):
    e = CASES[case]()
    back = type(e)(*e.args)
    assert str(back) == str(e)
    assert back.shard == URL
    assert _fields(back) == _fields(e)


def test_the_readable_rows_are_in_the_message():
    e = CASES["row group, start"]()
    assert e.rows_readable == (0, 17) and "dataset rows [0, 17) readable" in str(e)
    assert "readable)" not in str(CASES["row group"]())  # no start: the dataset rows are not known


def test_any_other_text_is_still_a_shard():
    assert ShardReadError("s3://b/x.parquet").shard == "s3://b/x.parquet"
    assert DamagedShardError("s3://b/x.parquet").shard == "s3://b/x.parquet"
