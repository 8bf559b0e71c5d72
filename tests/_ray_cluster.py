"""A local multi-node Ray cluster for the tests and benchmarks that place roles on nodes.

:func:`local_cluster`: a head of 1 CPU labelled ``speedtrap=head`` and two nodes of 2 CPUs labelled
``speedtrap=a`` and ``speedtrap=b``, each a raylet of its own on this machine, connected, shut down at the end.
:func:`raylets`: each node's raylet pid -> its label (what a role process's /proc ancestry leads to).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STORE = 80 * 1024 * 1024  # the object store holds nothing big here; Ray's default takes 30% of memory a node


@contextmanager
def local_cluster() -> Iterator[Any]:
    """A local Ray cluster of three labelled nodes, connected; shut down at the end."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "labels": {"speedtrap": "head"}, "object_store_memory": STORE},
    )
    c.add_node(num_cpus=2, labels={"speedtrap": "a"}, object_store_memory=STORE)
    c.add_node(num_cpus=2, labels={"speedtrap": "b"}, object_store_memory=STORE)
    ray.init(address=c.address, log_to_driver=False, logging_level=logging.WARNING)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def raylets(cluster: Any) -> dict[int, str]:
    """Each node's raylet pid -> the node's ``speedtrap`` label."""
    import ray

    labels = {n["NodeID"]: n.get("Labels", {}).get("speedtrap") for n in ray.nodes() if n.get("Alive")}
    out = {}
    for node in cluster.list_all_nodes():
        for info in node.all_processes.get("raylet", []):
            out[info.process.pid] = labels[node.node_id]
    return out
