"""Isolation trials on a real local Ray cluster: a head without CPUs and two one-CPU worker nodes.

Ground truth is the local executor's verdict on the same stack (and, for the killed worker, the
construction: the trial that kills its own worker is known in advance).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from speedtrap.isolate import Conclusion, FunctionOracle, RayExecutor, Status, TrialResources, TrialStore, isolate
from speedtrap.manifest import Manifest, VerdictSpec, load_manifest
from speedtrap.stack import TargetSpec

ray = pytest.importorskip("ray", reason="the Ray executor's tests need `pip install 'speedtrap[ray]'`")

PATCHES = [f"p{i}" for i in range(6)]
# p2 breaks alone; p4 and p5 break only together (a joint interaction).
FAILS = [{"all": ["p2"]}, {"all": ["p4", "p5"]}]
CULPRITS = [("p2",), ("p4", "p5")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    c.add_node(num_cpus=1)
    c.add_node(num_cpus=1)
    ray.init(address=c.address, log_to_driver=False, logging_level="WARNING")
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def broken(config: frozenset[str]) -> bool:
    return "p2" in config or {"p4", "p5"} <= config


def simulated_manifest() -> Manifest:
    return Manifest(
        None,
        TargetSpec(name="simulated"),
        (),
        verdict_spec=VerdictSpec(metric="metric", bound=0.5, near=0.0, repeats=0),
    )


def run_simulated(fn: Callable[[tuple[str, ...], int], dict[str, float]], run_dir: Path | None, executor: Any) -> Any:
    from speedtrap.isolate import Evaluator, Search, ThresholdRule

    store = TrialStore(run_dir)
    run_id, _ = store.begin_run({"sim": 1}, {}, True)
    evaluator = Evaluator(
        FunctionOracle(fn, {"sim": 1}), ThresholdRule("metric", 0.5, "above", 0.0), store, run_id, 0, 0, executor
    )
    try:
        result = Search(PATCHES, evaluator, capacity=evaluator.capacity).run()
    finally:
        store.close()
    return result, evaluator


def test_a_manifest_on_two_ray_workers_gives_the_local_verdict(
    cluster: Any, tiny_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    manifest = load_manifest(tiny_manifest(PATCHES, FAILS))
    local = isolate(manifest, tmp_path / "local")
    with RayExecutor(resources=TrialResources(num_cpus=1)) as executor:
        assert executor.capacity == 2  # two one-CPU nodes, one CPU a trial
        remote = isolate(manifest, tmp_path / "ray", executor=executor)
        nodes = {slot.node for slot in executor._slots}
    assert local.culprit_names == remote.culprit_names == CULPRITS
    assert [i.to_json() for i in remote.interactions] == [i.to_json() for i in local.interactions]
    assert {i.patches for i in remote.interactions} == {("p4", "p5")}
    assert len(nodes) == 2  # the two trial slots sat on the two worker nodes
    # The driver committed every record to its store, with the servers' logs.
    store = TrialStore(tmp_path / "ray")
    assert len(store.trials()) == remote.launches
    store.close()
    assert all(t.log_path and Path(t.log_path).is_file() for t in remote.trials)
    # Two servers at a time: some trials overlapped.
    spans = sorted((t.started, t.finished) for t in remote.trials)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans))


def test_bisect_cli_connects_to_a_running_cluster_by_address(
    cluster: Any, tiny_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    manifest = tiny_manifest(PATCHES, FAILS)
    argv = [sys.executable, "-m", "speedtrap", "bisect", "--manifest", str(manifest), "--run-dir", str(tmp_path / "r")]
    done = subprocess.run(
        [*argv, "--executor", "ray", "--address", cluster.address, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert [tuple(c["patches"]) for c in result["culprits"]] == CULPRITS
    assert "ray: 2 worker(s)" in done.stderr
    # Resume on the local executor with the same two slots: every trial it needs is in the store, none
    # runs again. (The search's plan reads what is already measured, so one slot at a time may ask for
    # other configurations than two slots with their look-ahead did.)
    again = subprocess.run(
        [*argv, "--resume", "--workers", "2", "--json"], capture_output=True, text=True, timeout=300, check=False
    )
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = json.loads(again.stdout)
    assert resumed["launches"] == 0 and 0 < resumed["reused"] <= result["launches"]
    assert resumed["culprits"] == result["culprits"]


VICTIM = ("p1",)  # a trial the search makes: patch p1 alone (passes)


def _kills_its_worker(marker_dir: Path, victim: tuple[str, ...], every_time: bool) -> Callable[..., dict[str, float]]:
    # Self-contained (no reference to this module's globals): Ray workers cannot import a test module.
    def fn(config: tuple[str, ...], repeat: int) -> dict[str, float]:
        if tuple(config) == victim:
            marker = marker_dir / "killed"
            if every_time or not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)  # the worker process dies mid-trial
        on = set(config)
        return {"metric": 1.0 if "p2" in on or {"p4", "p5"} <= on else 0.0}

    return fn


def test_a_worker_killed_mid_trial_fails_over_to_another_node(cluster: Any, tmp_path: Path) -> None:
    fn = _kills_its_worker(tmp_path, VICTIM, every_time=False)
    local, _ = run_simulated(lambda c, r: {"metric": float(broken(frozenset(c)))}, None, None)
    assert VICTIM in [j.config for j in local.judgements]  # the victim is a trial the search runs
    with RayExecutor(workers=1) as executor:
        remote, remote_eval = run_simulated(fn, tmp_path / "run", executor)
        assert executor.failovers == 1
        (dead_node, new_node), *_ = executor.moves
    assert (tmp_path / "killed").exists()  # the victim did kill its worker
    assert dead_node and new_node and dead_node != new_node  # and ran again on the other node
    assert remote.culprit_names == local.culprit_names == CULPRITS
    assert [i.to_json() for i in remote.interactions] == [i.to_json() for i in local.interactions]
    victim = [t for t in remote_eval.trials if t.config == VICTIM]
    assert len(victim) == 1 and victim[0].status == "ok" and victim[0].attempts == 2


def test_a_worker_that_dies_every_time_is_a_failed_trial_and_the_run_still_ends(cluster: Any, tmp_path: Path) -> None:
    victim = VICTIM
    fn = _kills_its_worker(tmp_path, victim, every_time=True)
    with RayExecutor(workers=1) as executor:
        result, evaluator = run_simulated(fn, tmp_path / "run", executor)
    lost = [t for t in evaluator.trials if t.config == victim]
    assert len(lost) == 1 and lost[0].status == "failed"
    assert "Ray worker died mid-trial" in (lost[0].error or "") and "died again" in (lost[0].error or "")
    assert result.status in (Status.FOUND, Status.INCONCLUSIVE)
    assert any(j.config == victim and j.verdict is Conclusion.ERROR for j in result.judgements)
    # Nothing finished is lost: every other trial is in the store, and a rerun runs none of them again.
    finished = [t for t in evaluator.trials if t.status == "ok"]
    store = TrialStore(tmp_path / "run")
    assert len([t for t in store.trials() if t.status == "ok"]) == len(finished)
    store.close()
    again, again_eval = run_simulated(lambda c, r: {"metric": float(broken(frozenset(c)))}, tmp_path / "run", None)
    ran_again = {t.config for t in again_eval.trials if not t.reused}
    assert again_eval.reused > 0 and not ran_again & {t.config for t in finished}
    assert again.culprit_names == CULPRITS


def test_a_bad_address_is_one_line_and_fast(tmp_path: Path, tiny_manifest: Callable[..., Path]) -> None:
    manifest = tiny_manifest(PATCHES, FAILS)
    done = subprocess.run(
        [sys.executable, "-m", "speedtrap", "bisect", "--manifest", str(manifest), "--executor", "ray",
         "--address", "127.0.0.1:1", "--run-dir", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no Ray cluster answers at 127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_oracle_a_worker_cannot_rebuild_is_one_clear_error(cluster: Any, tmp_path: Path) -> None:
    from speedtrap._errors import UsageError

    # `broken` lives in this test module, which Ray workers cannot import: the recipe cannot be rebuilt.
    with RayExecutor(workers=1) as executor, pytest.raises(UsageError, match="cannot be rebuilt on a Ray worker"):
        run_simulated(lambda c, r: {"metric": float(broken(frozenset(c)))}, tmp_path / "run", executor)


@pytest.mark.slow
def test_smol_moe_in_process_on_two_ray_workers_gives_the_local_verdict(
    cluster: Any, smol: Any, tmp_path: Path
) -> None:
    """Each worker loads its own smol-moe (from the converted-weights cache) and runs trials on it."""
    from speedtrap.isolate import manifest_for_target
    from speedtrap.manifest import ProbeSpec
    from speedtrap.targets.smolmoe import SmolMoETarget

    eight = [i.name for i in SmolMoETarget().patch_infos()]
    probe = ProbeSpec("divergence", None, {"lengths": [64], "decode_tokens": 8, "bucket_size": 64})
    verdict = VerdictSpec(metric="worst.kl_p99", bound=0.1, near=0.25, repeats=0)
    manifest = manifest_for_target("smol-moe", eight, probe=probe, verdict=verdict)
    local = isolate(manifest, tmp_path / "local", model=smol)
    with RayExecutor() as executor:
        assert executor.capacity == 2
        remote = isolate(manifest, tmp_path / "ray", model=smol, executor=executor)
        nodes = {slot.node for slot in executor._slots}
    assert remote.status is local.status is Status.FOUND
    assert remote.culprit_names == local.culprit_names == [("hash_topk_routed_scaling",)]
    assert remote.interactions == local.interactions == ()
    assert len(nodes) == 2
    # The figures agree trial by trial where both measured the same configuration (same model, same probe).
    mine = {t.config: t.figures["worst.kl_p99"] for t in local.trials}
    for t in remote.trials:
        if t.config in mine:
            assert t.figures["worst.kl_p99"] == pytest.approx(mine[t.config], rel=1e-4, abs=1e-6)


def test_a_node_lost_mid_trial_moves_the_trial_to_the_other_node(cluster: Any, tmp_path: Path) -> None:
    """The whole node under a running trial is removed (its raylet and workers die); the run goes on."""
    import threading
    import time

    victim = VICTIM
    marker = tmp_path / "started"

    def fn(config: tuple[str, ...], repeat: int) -> dict[str, float]:
        if tuple(config) == victim and not marker.exists():
            marker.write_text("1")
            time.sleep(60)  # the node goes away while this trial runs
        on = set(config)
        return {"metric": 1.0 if "p2" in on or {"p4", "p5"} <= on else 0.0}

    with RayExecutor(workers=1) as executor:

        def remove_the_trials_node() -> None:
            deadline = time.monotonic() + 120
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            node_id = executor._slots[0].node
            (node,) = [n for n in cluster.list_all_nodes() if n.node_id == node_id]
            cluster.remove_node(node, allow_graceful=False)

        killer = threading.Thread(target=remove_the_trials_node)
        killer.start()
        t0 = time.monotonic()
        result, evaluator = run_simulated(fn, tmp_path / "run", executor)
        killer.join()
        moves = list(executor.moves)
    cluster.add_node(num_cpus=1)  # give the module's cluster back its second worker node
    cluster.wait_for_nodes()
    assert time.monotonic() - t0 < 60  # the trial did not wait out its sleep on the lost node
    assert result.culprit_names == CULPRITS
    (trial,) = [t for t in evaluator.trials if t.config == victim]
    assert trial.status == "ok" and trial.attempts == 2
    (dead, new), *_ = moves
    assert dead and new and dead != new


@pytest.mark.timeout(300)
def test_a_worker_killed_while_every_slot_is_busy_fails_over_without_hanging(cluster: Any, tmp_path: Path) -> None:
    """Both nodes hold a worker; the replacement must take the dead worker's room, not wait for the other's."""
    fn = _kills_its_worker(tmp_path, ("p0", "p1", "p2", "p3", "p4", "p5"), every_time=False)  # the full set
    local, _ = run_simulated(lambda c, r: {"metric": float(broken(frozenset(c)))}, None, None)
    with RayExecutor() as executor:
        assert executor.capacity == 2
        remote, remote_eval = run_simulated(fn, tmp_path / "run", executor)
        assert executor.failovers == 1
    assert (tmp_path / "killed").exists()
    assert remote.culprit_names == local.culprit_names == CULPRITS
    (full,) = [t for t in remote_eval.trials if t.config == tuple(PATCHES)]
    assert full.status == "ok" and full.attempts == 2


def test_a_request_the_cluster_cannot_hold_is_one_clear_error(cluster: Any) -> None:
    from speedtrap._errors import UsageError

    with pytest.raises(UsageError, match=r"holds 2 trial\(s\) of \{CPU 1\} at once, not 3 workers"):
        RayExecutor(workers=3)
    with pytest.raises(UsageError, match=r"holds 0 trial\(s\) of \{CPU 1, GPU 1\}"):
        RayExecutor(resources=TrialResources(num_gpus=1))
    with pytest.raises(UsageError, match=r"search\.resources\.CPU is set by num_cpus"):
        TrialResources.from_table({"CPU": 1})
