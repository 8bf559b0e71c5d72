"""The trial store and resuming: a real SQLite file, real server processes, a run killed with SIGKILL."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from speedtrap._errors import StoreError
from speedtrap.isolate import Outcome, Status, Trial, TrialStore, isolate, trial_key
from speedtrap.manifest import load_manifest

# The stack's truth: c alone breaks it; a breaks it only without b (correct only together).
PATCHES = ["a", "b", "c", "d", "e", "f"]
FAILS = [{"all": ["c"]}, {"all": ["a"], "none": ["b"]}]


def _trial(config: tuple[str, ...], metric: float, status: str = "ok") -> Trial:
    return Trial(0, config, 0, status, Outcome.FAIL if metric > 0.5 else Outcome.PASS, {"metric": metric})


def test_trials_are_committed_one_by_one_and_found_again(tmp_path: Path) -> None:
    with TrialStore(tmp_path) as store:
        run_id, continued = store.begin_run({"id": 1}, {}, resume=False)
        assert not continued
        stored = store.record(trial_key({"t": 1}, ("a",), 0), run_id, _trial(("a",), 1.0))
        # Another connection sees it at once: it was committed, not buffered.
        other = sqlite3.connect(tmp_path / "trials.sqlite")
        assert other.execute("SELECT config, figures FROM trials").fetchall() == [('["a"]', '{"metric": 1.0}')]
        other.close()
        store.record(trial_key({"t": 1}, ("b",), 0), run_id, _trial(("b",), 0.0, status="failed"))
        found = store.lookup(trial_key({"t": 1}, ("a",), 0))
        assert found is not None and found.reused and found.index == stored.index and found.figures == {"metric": 1.0}
        assert store.lookup(trial_key({"t": 1}, ("b",), 0)) is None  # a failed trial is never reused
        assert store.lookup(trial_key({"t": 2}, ("a",), 0)) is None  # another target or probe: another key


def test_an_interrupted_run_needs_resume_and_one_directory_has_one_writer(tmp_path: Path) -> None:
    with TrialStore(tmp_path) as store:
        first, _ = store.begin_run({"id": 1}, {}, resume=False)
        with pytest.raises(StoreError, match="another speedtrap process is running"):
            TrialStore(tmp_path)
    with TrialStore(tmp_path) as store:
        with pytest.raises(StoreError, match="pass --resume"):
            store.begin_run({"id": 1}, {}, resume=False)
        again, continued = store.begin_run({"id": 1}, {}, resume=True)
        assert (again, continued) == (first, True)


def test_a_corrupt_store_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "trials.sqlite").write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StoreError, match="cannot be read"):
        TrialStore(tmp_path)


def test_relaunching_per_configuration_finds_the_culprit_and_the_pair(
    tiny_manifest: Callable[..., Path], launch_log: Callable[[], list[str]], tmp_path: Path
) -> None:
    manifest = tiny_manifest(PATCHES, FAILS, flags=["d", "e"])  # some patches by env var, some by flag
    run_dir = tmp_path / "run"
    result = isolate(load_manifest(manifest), run_dir)
    assert result.status is Status.FOUND and result.culprit_names == [("c",)]
    kinds = {(i.kind.value, i.patches) for i in result.interactions}
    assert kinds <= {("cancel", ("a", "b")), ("masked", ("a", "b"))}
    launched = launch_log()
    assert len(launched) == result.launches == len(result.trials)
    assert all(Path(str(t.log_path)).exists() for t in result.trials)
    # The server saw exactly the configuration each trial asked for (env vars and flags alike).
    assert sorted(launched) == sorted(",".join(t.config) for t in result.trials)
    # A second run in the same directory reuses every trial and launches nothing.
    again = isolate(load_manifest(manifest), run_dir)
    assert again.launches == 0 and again.reused == len(result.trials)
    assert again.culprit_names == result.culprit_names and len(launch_log()) == len(launched)


def test_a_server_killed_mid_trial_is_retried_and_its_log_kept(
    tiny_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    marker = tmp_path / "kill-once"
    marker.write_text("")
    manifest = tiny_manifest(PATCHES, FAILS, probe_args=[str(marker)])
    result = isolate(load_manifest(manifest), tmp_path / "run")
    assert not marker.exists()  # the test's probe did kill -9 the first server
    first = result.trials[0]
    assert first.config == () and first.status == "ok" and first.attempts == 2
    assert (tmp_path / "run" / "trials" / "trial-0001.log").exists()  # the killed attempt's log is kept
    assert result.culprit_names == [("c",)]


def test_a_configuration_whose_server_always_dies_is_marked_failed_with_its_log(
    tiny_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    manifest = tiny_manifest(PATCHES, [{"all": ["c"]}], env={"TINY_DIE_ON": "e"}, target={"retries": 1})
    result = isolate(load_manifest(manifest), tmp_path / "run")
    failed = [t for t in result.trials if t.status == "failed"]
    assert failed and all("e" in t.config and t.attempts == 2 for t in failed)
    assert all(t.log_path and Path(t.log_path).exists() and "signal 9" in str(t.error) for t in failed), [
        (t.log_path, t.error) for t in failed
    ]
    assert result.status is Status.ERROR and "the full set's verdict is error" in result.message


def _bisect(manifest: Path, run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "speedtrap",
            "bisect",
            "--manifest",
            str(manifest),
            "--run-dir",
            str(run_dir),
            "--json",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_a_run_killed_midway_resumes_with_the_same_verdict_and_reruns_no_finished_trial(
    tiny_manifest: Callable[..., Path], launch_log: Callable[[], list[str]], tmp_path: Path
) -> None:
    manifest = tiny_manifest(PATCHES, FAILS, env={"TINY_PROBE_DELAY": "0.3"})
    run_dir = tmp_path / "run"
    proc = _bisect(manifest, run_dir)
    db = run_dir / "trials.sqlite"
    deadline = time.monotonic() + 120
    done = 0
    while time.monotonic() < deadline and done < 4:
        time.sleep(0.2)
        if db.exists():
            try:
                with sqlite3.connect(db) as conn:
                    done = conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
            except sqlite3.OperationalError:  # the file is there, its tables not yet (the run is creating them)
                continue
    assert done >= 4, proc.communicate(timeout=30)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    with sqlite3.connect(db) as conn:
        finished_before = [tuple(json.loads(c)) for (c,) in conn.execute("SELECT config FROM trials WHERE status='ok'")]
        status = conn.execute("SELECT status FROM runs").fetchall()
    assert status == [("running",)]

    refused = _bisect(manifest, run_dir)
    out, err = refused.communicate(timeout=120)
    assert refused.returncode == 2 and "pass --resume" in err

    resumed = _bisect(manifest, run_dir, "--resume")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    result = json.loads(out)
    assert result["status"] == "found" and [c["patches"] for c in result["culprits"]] == [["c"]]
    reused = {tuple(t["config"]) for t in result["trials"] if t["reused"]}
    assert set(finished_before) <= reused
    # Ground truth from the servers themselves: no finished configuration was launched again
    # (only the one in flight at the kill may have been).
    counts = Counter(launch_log())
    relaunched = [cfg for cfg, n in counts.items() if n > 1]
    assert len(relaunched) <= 1
    assert all((tuple(cfg.split(",")) if cfg else ()) not in finished_before for cfg in relaunched)
    # The verdict equals an uninterrupted run's.
    fresh = isolate(load_manifest(manifest), tmp_path / "fresh")
    assert [list(c) for c in fresh.culprit_names] == [c["patches"] for c in result["culprits"]]
    assert [i.to_json() for i in fresh.interactions] == result["interactions"]


def test_several_servers_at_once_give_the_same_verdict(tiny_manifest: Callable[..., Path], tmp_path: Path) -> None:
    patches = [f"p{i}" for i in range(8)]
    fails = [{"all": ["p2"]}, {"all": ["p6"]}]
    serial = isolate(load_manifest(tiny_manifest(patches, fails, name="one.toml")), tmp_path / "one")
    parallel_manifest = tiny_manifest(patches, fails, extra={"search": {"parallel": 3}}, name="three.toml")
    parallel = isolate(load_manifest(parallel_manifest), tmp_path / "three")
    assert serial.culprit_names == parallel.culprit_names == [("p2",), ("p6",)]
    # Three servers at a time: the bisection tests three split points per round (more launches, fewer rounds).
    assert parallel.launches >= serial.launches
    started = sorted(t.started for t in parallel.trials)
    overlapping = sum(1 for a, b in itertools.pairwise(started) if b - a < 0.05)
    assert overlapping >= 1
