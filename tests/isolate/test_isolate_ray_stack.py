"""Stack trials on a real local Ray cluster: a head without CPUs and two worker nodes of three CPUs each.

Each trial of a three-role stack (prefill, decode, router: tiny real servers) reserves a placement group of one
bundle per role packed on one node; the two nodes hold two trials at once. Ground truth: the local executor's
verdict on the same manifest, Ray's own placement table, and each role process's ancestry as /proc showed it
when it started (the Ray worker that launched it, whose node Ray reports).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_isolate_roles import PATCHES, pd_roles, write_stack

from speedtrap.isolate import RayExecutor, Status, TrialResources, isolate
from speedtrap.manifest import load_manifest

ray = pytest.importorskip("ray", reason="the Ray executor's tests need `pip install 'speedtrap[ray]'`")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    c.add_node(num_cpus=3)
    c.add_node(num_cpus=3)
    ray.init(address=c.address, log_to_driver=False, logging_level="WARNING")
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def test_two_stack_trials_at_once_each_whole_on_one_node_give_the_local_verdict(cluster: Any, tmp_path: Path) -> None:
    lineage = tmp_path / "lineage.txt"
    env = {"TINY_EVENTS": str(tmp_path / "events.txt"), "TINY_LINEAGE": str(lineage), "TINY_GROUP": "{router.port}"}
    roles = pd_roles(router={"TINY_PROBE_DELAY": "1"})  # trials long enough to overlap
    manifest = load_manifest(write_stack(tmp_path, roles, PATCHES, {"env": env}))
    local = isolate(manifest, tmp_path / "local")
    assert local.status is Status.FOUND and local.culprit_names == [("p1@prefill",)]
    lineage.unlink()
    with RayExecutor(resources=TrialResources(num_cpus=3)) as executor:
        assert executor.capacity == 2  # two nodes of three CPUs, a whole stack (three roles) a trial
        remote = isolate(manifest, tmp_path / "ray", executor=executor)
        groups = executor.placement()
        workers = {slot.pid: slot.node for slot in executor._slots}
    assert remote.status is local.status and remote.culprit_names == local.culprit_names
    # Ray's placement: one group per slot, one bundle of one CPU per role, every bundle on the group's one node.
    assert len(groups) == 2 and all(g["strategy"] == "STRICT_PACK" for g in groups), groups
    assert all(len(g["bundles"]) == 3 and len(set(g["nodes"])) == 1 for g in groups), groups
    assert len({g["nodes"][0] for g in groups}) == 2  # the two slots on the two nodes
    # Each trial's three roles were launched by one Ray worker, hence on one node.
    trials: dict[str, dict[str, str]] = {}
    for line in lineage.read_text().splitlines():
        role, group, _pid, chain = line.split()
        worker = next(int(p) for p in chain.split(",") if int(p) in workers)
        trials.setdefault(group, {})[role] = workers[worker]
    assert len(trials) == remote.launches and all(len(t) == 3 for t in trials.values()), trials
    assert all(len(set(t.values())) == 1 for t in trials.values()), trials
    assert len({n for t in trials.values() for n in t.values()}) == 2  # both nodes ran trials
    spans = sorted((t.started, t.finished) for t in remote.trials)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans))  # two trials at once
