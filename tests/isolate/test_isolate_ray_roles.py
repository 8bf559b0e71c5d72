"""Roles on separate Ray nodes: prefill on one node, decode on another, router on the head (local Ray cluster).

The cluster: a head and two worker nodes, each labelled (``speedtrap=head|a|b``). The manifest places each
role by its label (``[target.roles.NAME] node = ...``); each trial's stack is one placement group of a bundle
per role. Ground truth: the culprit the local executor finds on the same stack, Ray's placement table, and each
role process's ancestry in /proc when it started (the raylet of the node whose Ray worker launched it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_isolate_roles import PATCHES, pd_roles, write_stack

from _ray_cluster import local_cluster, raylets
from speedtrap._errors import UsageError
from speedtrap.isolate import RayExecutor, Status, isolate
from speedtrap.manifest import load_manifest

ray = pytest.importorskip("ray", reason="the Ray executor's tests need `pip install 'speedtrap[ray]'`")

WHERE = {"prefill": "speedtrap=a", "decode": "b", "router": "speedtrap=head"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster() as c:
        yield c


def _placed_roles(tmp_path: Path, where: dict[str, str], **extra: dict[str, str]) -> dict[str, dict[str, Any]]:
    roles = pd_roles(**extra)
    roles["router"]["env"]["TINY_UPSTREAM"] = "http://{prefill.host}:{prefill.port},http://{decode.host}:{decode.port}"
    for name, label in where.items():
        roles[name]["node"] = label
        roles[name]["env"]["TINY_BIND"] = "0.0.0.0"  # reached from the other nodes, at its node's address
        roles[name]["health"] = "http://{host}:{port}/health"
    roles["router"]["resources"] = {"CPU": 1}
    return roles


def test_prefill_decode_and_router_each_on_its_node_give_the_local_verdict(cluster: Any, tmp_path: Path) -> None:
    lineage = tmp_path / "lineage.txt"
    env = {"TINY_EVENTS": str(tmp_path / "events.txt"), "TINY_LINEAGE": str(lineage), "TINY_GROUP": "{router.port}"}
    manifest = load_manifest(write_stack(tmp_path, _placed_roles(tmp_path, WHERE), PATCHES, {"env": env}))
    local = isolate(manifest, tmp_path / "local")  # the same stack on this machine (the labels unused)
    assert local.status is Status.FOUND and local.culprit_names == [("p1@prefill",)]
    lineage.unlink()
    with RayExecutor() as executor:
        remote = isolate(manifest, tmp_path / "ray", executor=executor)
        groups = executor.placement()
    assert remote.status is local.status and remote.culprit_names == local.culprit_names
    assert len(groups) == 1 and groups[0]["strategy"] == "SPREAD" and len(set(groups[0]["nodes"])) == 3, groups
    found = raylets(cluster)
    seen: dict[str, set[str]] = {}
    for line in lineage.read_text().splitlines():
        role, _group, _pid, chain = line.split()
        node = next(found[int(p)] for p in chain.split(",") if int(p) in found)
        seen.setdefault(role, set()).add(node)
    assert seen == {"prefill": {"a"}, "decode": {"b"}, "router": {"head"}}, seen
    ids = {n.get("Labels", {}).get("speedtrap"): n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    [where] = [n for n in remote.notes if n.startswith("the stack's roles ran on: ")]
    for role, label in (("prefill", "a"), ("decode", "b"), ("router", "head")):
        assert f"{role} on Ray node {ids[label][:12]} (speedtrap={label}) at " in where, where
    assert sum(1 for _ in lineage.read_text().splitlines()) == 3 * remote.launches


def test_a_label_no_node_carries_is_refused_naming_the_nodes(cluster: Any, tmp_path: Path) -> None:
    where = {**WHERE, "decode": "speedtrap=gpu-z"}
    manifest = load_manifest(write_stack(tmp_path, _placed_roles(tmp_path, where), PATCHES))
    with RayExecutor() as executor, pytest.raises(UsageError) as caught:
        isolate(manifest, tmp_path / "run", executor=executor)
    text = caught.value.one_line()
    assert "target.roles.decode.node = 'speedtrap=gpu-z'" in text and "no Ray node carries" in text, text
    assert all(f"speedtrap={x}" in text for x in ("head", "a", "b")), text
    assert not (tmp_path / "events.txt").exists()  # nothing launched


def test_a_role_asking_for_more_ranks_than_its_node_has_cores_is_refused_before_any_launch(
    cluster: Any, tmp_path: Path
) -> None:
    roles = _placed_roles(tmp_path, WHERE)
    roles["prefill"]["launch"] = [*roles["prefill"]["launch"], "--tp", "4"]
    manifest = load_manifest(write_stack(tmp_path, roles, PATCHES))
    with RayExecutor() as executor, pytest.raises(UsageError) as caught:
        isolate(manifest, tmp_path / "run", executor=executor)
    text = caught.value.one_line()
    assert "target.roles.prefill asks for 4 ranks" in text and "at most 2 CPUs" in text, text
    assert "\n" not in caught.value.problem
    assert not (tmp_path / "events.txt").exists()


def test_the_manifest_keys_are_read_and_checked(tmp_path: Path) -> None:
    from speedtrap._errors import ManifestError

    roles = _placed_roles(tmp_path, WHERE)
    manifest = load_manifest(write_stack(tmp_path, roles, PATCHES))
    stack = manifest.target.stack
    assert stack is not None
    assert {r.name: r.node for r in stack.roles} == WHERE
    assert stack.role("router").resources == (("CPU", 1.0),)
    assert json.dumps(stack.to_json())  # node and resources in the stack's identity
    roles["decode"]["resources"] = {"GPU": "one"}
    with pytest.raises(ManifestError, match=r"target\.roles\.decode\.resources\.GPU = 'one'"):
        load_manifest(write_stack(tmp_path, roles, PATCHES, name="bad.toml"))


def test_a_role_killed_on_its_node_is_named_with_the_node_nothing_is_left_and_resume_finishes(
    cluster: Any, tmp_path: Path
) -> None:
    import os
    import signal
    import threading
    import time

    lineage = tmp_path / "lineage.txt"
    env = {"TINY_LINEAGE": str(lineage), "TINY_GROUP": "{router.port}", "TINY_STAY": "1"}
    roles = _placed_roles(tmp_path, WHERE, router={"TINY_PROBE_DELAY": "3"})  # the first trial lasts 3 s
    path = write_stack(tmp_path, roles, PATCHES, {"env": env, "retries": 0})
    manifest = load_manifest(path)
    got: list[Any] = []
    with RayExecutor() as executor:
        thread = threading.Thread(target=lambda: got.append(isolate(manifest, tmp_path / "run", executor=executor)))
        thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (lineage.exists() and len(lineage.read_text().splitlines()) >= 3):
            time.sleep(0.1)
        time.sleep(1)  # the stack up, its first trial's probe waiting on the router
        first = [line.split() for line in lineage.read_text().splitlines()]
        prefill = next(int(pid) for role, _g, pid, _c in first if role == "prefill")
        os.kill(prefill, signal.SIGKILL)
        thread.join(120)
    [result] = got
    prefill_node = next(n["NodeID"] for n in ray.nodes() if n.get("Labels", {}).get("speedtrap") == "a")
    errors = [t.error or "" for t in result.trials if t.error]
    assert result.status is Status.ERROR and errors, result.message
    assert "role 'prefill'" in errors[0] and "signal 9" in errors[0] and prefill_node[:12] in errors[0], errors[0]
    pids = [int(line.split()[2]) for line in lineage.read_text().splitlines()]
    time.sleep(1)
    assert [p for p in pids if os.path.exists(f"/proc/{p}")] == []  # nothing of any stack left on any node
    with RayExecutor() as executor:
        resumed = isolate(manifest, tmp_path / "run", resume=True, executor=executor)
    assert resumed.status is Status.FOUND and resumed.culprit_names == [("p1@prefill",)]


def test_the_report_names_each_roles_node_and_ranks(tmp_path: Path) -> None:
    from speedtrap.report._adapt import isolation_section

    roles = _placed_roles(tmp_path, WHERE)
    roles["decode"]["launch"] = [*roles["decode"]["launch"], "--tp", "2"]
    manifest = load_manifest(write_stack(tmp_path, roles, PATCHES))
    doc = {"status": "found", "target": manifest.target.identity()}
    notes = isolation_section(doc).notes
    assert notes == (
        "the stack's roles: prefill on node speedtrap=a, 1 rank; decode on node b, 2 ranks; "
        "router on node speedtrap=head, 1 rank",
    ), notes


def test_search_parallel_places_that_many_whole_stacks_each_spread_over_the_nodes(cluster: Any, tmp_path: Path) -> None:
    import itertools

    roles = _placed_roles(tmp_path, WHERE, router={"TINY_PROBE_DELAY": "1"})  # trials long enough to overlap
    for name in roles:
        roles[name]["resources"] = {"CPU": 0.5}  # two stacks fit: half a CPU per role, the head holds one
    manifest = load_manifest(write_stack(tmp_path, roles, PATCHES))
    with RayExecutor(workers=2) as executor:
        result = isolate(manifest, tmp_path / "run", executor=executor)
        groups = executor.placement()
    assert result.status is Status.FOUND and result.culprit_names == [("p1@prefill",)]
    assert len(groups) == 2 and all(len(set(g["nodes"])) == 3 for g in groups), groups
    assert groups[0]["nodes"] == groups[1]["nodes"]  # each role on its labelled node, in both stacks
    spans = sorted((t.started, t.finished) for t in result.trials)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans))  # two stacks alive at once, as asked
