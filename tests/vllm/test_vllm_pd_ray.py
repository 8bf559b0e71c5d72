"""The real vLLM PD example (examples/vllm-pd/) with its roles on two Ray nodes: prefill on one node, decode on
another, the router on the head (a local Ray cluster of three raylets on this machine; tests/vllm/vllm_pd_ray.py).

One hunt, interrupted: the first trial's prefill API server is killed (SIGKILL) on its node once the trial's
router is up, and the run is resumed. Ground truth: the culprit is constructed (the example plugin's MLP x1.5 in
passes of more than 64 tokens: the prefill path only; the local hunt names it, tests/vllm/test_vllm_pd.py);
each process's role is the ``SPEEDTRAP_TEST_ROLE`` its role's environment carries and its node is the raylet its
ancestry in /proc leads to; the nodes' ids are Ray's; a watcher counts vLLM API servers the whole time.

The baseline recording (``reference.strec``) is made by the driver before any trial, with the stack on this
machine (not through Ray); only the trials are placed on the nodes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import vllm_stack
from vllm_pd_ray import MARKER, TWO_NODES, RoleScan, local_cluster, node_ids, placed_manifest, raylets

from _watch import ServerWatcher, argv_has, marked
from speedtrap.cli import app
from speedtrap.isolate import RayExecutor, Status, isolate
from speedtrap.manifest import load_manifest

pytest.importorskip("ray", reason="roles on Ray nodes need `pip install 'speedtrap[ray]'`")

CULPRIT = "prefill_mlp_scale@prefill"


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.timeout(3600)  # a recording and about five stack launches of 45-160 s each (the cores shared)
def test_pd_on_two_ray_nodes_kill9_names_role_and_node_leaves_nothing_and_resume_names_the_culprit(
    tmp_path: Path,
) -> None:
    vllm_stack.ensure_stack()
    marker = f"{tmp_path.name}-{os.getpid()}"
    manifest = load_manifest(placed_manifest(tmp_path, TWO_NODES, marker, retries=0))  # a killed trial not retried
    assert {r.name: r.node for r in manifest.target.stack.roles} == TWO_NODES  # type: ignore[union-attr]
    run = tmp_path / "run"
    servers = ServerWatcher(argv_has(b"vllm.entrypoints.openai.api_server"), marked(MARKER, marker))
    with local_cluster() as cluster, servers as watcher, RoleScan(marker, raylets(cluster)) as scan:
        ids = node_ids(cluster)
        got: list[Any] = []
        failed: list[BaseException] = []

        def hunt() -> None:
            try:
                with RayExecutor() as executor:
                    got.append(isolate(manifest, run, executor=executor))
            except BaseException as exc:
                failed.append(exc)

        t0 = time.monotonic()
        thread = threading.Thread(target=hunt)
        thread.start()
        victim = None
        while victim is None and thread.is_alive() and time.monotonic() - t0 < 1800:
            time.sleep(0.2)
            leaders = scan.leaders()
            if any(s.role == "router" and s.node == "head" for s in leaders):  # a trial's stack healthy on Ray
                victim = next(s for s in leaders if s.role == "prefill" and s.node == "a")
                time.sleep(1)
                os.kill(victim.pid, signal.SIGKILL)
        thread.join(1800)
        killed_s = time.monotonic() - t0
        assert not failed, failed
        assert victim is not None, "no trial's stack came up on the Ray nodes"
        [result] = got
        errors = [t.error for t in result.trials if t.error]
        assert result.status is Status.ERROR and len(errors) == 1, (result.status, errors)
        assert "role 'prefill'" in errors[0] and "signal 9" in errors[0], errors[0]
        assert ids["a"][:12] in errors[0], (ids, errors[0])  # the node it ran on, by Ray's id
        left = scan.settled(30)
        assert left == [], left  # every process of every stack seen is gone, on every node (none a zombie either)
        assert scan.alive() == []  # nor any other process carrying the marker

        t1 = time.monotonic()
        with RayExecutor() as executor:
            resumed = isolate(manifest, run, resume=True, executor=executor)
        resume_s = time.monotonic() - t1
        scan.scan()
        left = scan.settled(30)
        assert left == [] and scan.alive() == [], left
    print(f"kill run {killed_s:.0f} s ({result.launches} launches); resume {resume_s:.0f} s ({resumed.launches})")
    assert resumed.status is Status.FOUND, resumed.summary()
    assert resumed.culprit_names == [(CULPRIT,)]
    assert watcher.most == 2, f"{watcher.most} vLLM API servers alive at once (a stack is two)"
    # Where every role's own process ran: on Ray, prefill on a, decode on b, the router on the head; the driver's
    # recording of the baseline on this machine outside Ray.
    placed = {(s.role, s.node) for s in scan.leaders()}
    assert placed == {("prefill", "a"), ("decode", "b"), ("router", "head"),
                      ("prefill", None), ("decode", None), ("router", None)}, placed  # fmt: skip
    out = CliRunner().invoke(app, ["report", str(run), "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads((run / "report.json").read_text())
    notes = [n for n in report["isolation"]["notes"] if "roles ran on" in n]
    assert len(notes) == 1, report["isolation"]["notes"]
    for role, label in TWO_NODES.items():
        node = ids[label.split("=")[1]]
        assert f"{role} on Ray node {node[:12]} ({label})" in notes[0], notes[0]
    assert CULPRIT in json.dumps(report["verdict"]), report["verdict"]
