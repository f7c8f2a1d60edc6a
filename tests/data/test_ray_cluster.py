"""Ray Data on a local multi-node cluster: two Ray nodes started on this machine by the test
(``ray.cluster_utils.Cluster``: a head with 1 CPU, a worker node with 2), the documented call sized
from the cluster (`encode_with_ray`: 3 CPUs -> 2 encoder actors, one CPU left for the read task),
rows equal to ``datasets.map``'s. The nodes are stopped by the test."""

from __future__ import annotations

import functools
import os
import sys

import pyarrow as pa
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.data.ray_data import cluster_workers, encode_with_ray

from conftest import processor_for
from helpers import raw_dataset

FAMILY = "internvl"  # a tiled family: the patch-grid ones run in test_ray_data.py


def node_marking_processor(marker_dir: str, family: str):
    """Processor factory run in each actor: leaves a file named after the actor's node."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    with open(os.path.join(marker_dir, f"{node}-{os.getpid()}"), "w"):
        pass
    return testing.build_processor(family)


@pytest.fixture(scope="module")
def two_nodes():
    ray = pytest.importorskip("ray", reason="ray is an optional extra: pip install -e '.[ray]'")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local cluster
    # both nodes on this machine's own address: with node_ip_address="127.0.0.1" the driver's
    # ray.init still resolves 127.0.0.1 to that address (Ray's resolve_ip_for_localhost) and
    # waits forever for a GCS that listens on loopback only
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield ray
    finally:
        ray.shutdown()
        cluster.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_two_node_cluster_rows_equal_datasets_map(two_nodes, tmp_path):
    ray = two_nodes
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    assert ray.cluster_resources()["CPU"] == 3 and cluster_workers() == 2
    raw = raw_dataset(tmp_path)
    raw = raw.add_column("id", list(range(len(raw))))
    want = raw.map(mmpipe.encode, fn_kwargs={"processor": processor_for(FAMILY)}, remove_columns=raw.column_names)
    (tmp_path / "raw_pq").mkdir()
    for i in range(2):  # two files, two read blocks: work for both actors; a path both nodes read
        raw.shard(2, i, contiguous=True).to_parquet(str(tmp_path / "raw_pq" / f"{i}.parquet"))
    markers = tmp_path / "built"
    markers.mkdir()
    out = encode_with_ray(ray.data.read_parquet(str(tmp_path / "raw_pq")),
                          functools.partial(node_marking_processor, str(markers), FAMILY),
                          batch_size=4, keep_columns=["id"])
    table = pa.concat_tables(ray.get(out.to_arrow_refs()))
    table = table.take(pa.compute.sort_indices(table.column("id")))
    assert table.column("id").to_pylist() == list(range(len(raw)))
    assert table.drop_columns(["id"]).equals(want.data.table)
    actors = os.listdir(markers)
    assert 1 <= len(actors) <= 2, actors  # one processor per actor, at most the pool's size
    print(f"encoder actors on nodes: {sorted(a.split('-')[0][:8] for a in actors)}")
