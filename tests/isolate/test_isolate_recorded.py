"""Isolate with a recorded baseline: one server of the stack at a time, the same verdict as side by side.

The slow test runs a real ``speedtrap serve`` manifest twice (recorded, the default, and ``reference =
"live"``) while a watcher thread polls /proc for the stack's processes (tagged by a unique served
model name) and their listening ports.
"""

from __future__ import annotations

import pickle
import sys
import uuid
from pathlib import Path

import pytest

from _watch import ServerWatcher, argv_has
from speedtrap._errors import ManifestError, UsageError
from speedtrap.isolate import ServerOracle, Status, isolate
from speedtrap.manifest import ProbeSpec, load_manifest
from speedtrap.probe import DivergenceSettings, Identity
from speedtrap.probe._recording_format import FORMAT, VERSION, Block, Names, RecordingWriter, SequenceRecord
from speedtrap.stack import TargetSpec

SETTINGS = {"lengths": [64], "sequences": 1, "decode_tokens": 8, "bucket_size": 64, "top_k": 5}


def _write(path: Path) -> Path:
    settings = DivergenceSettings(**{**SETTINGS, "lengths": (64,)})
    header = {"type": "header", "format": FORMAT, "version": VERSION,
              "identity": Identity("http", "m", "f", "ids").to_json(),
              "probes": {"divergence": settings.to_json(), "recall": None}}  # fmt: skip
    writer = RecordingWriter(path, header)
    names = Names(None)
    empty = Block.of_dists([], [], names)
    writer.write(SequenceRecord(64, 0, tuple(range(64)), None, names, tuple(range(64)), empty, "greedy", 56, (),
                                empty).to_json())  # fmt: skip
    writer.write({"type": "end"})
    writer.close()
    return path


def _manifest(tmp_path: Path, probe: str) -> Path:
    path = tmp_path / "speedtrap.toml"
    path.write_text(f"""
[target]
launch = ["{sys.executable}", "-c", "pass", "{{port}}"]
[[patches]]
name = "a"
args = ["--a"]
[probe]
{probe}
[verdict]
bound = 0.1
""")
    return path


def test_the_manifest_names_the_reference(tmp_path: Path) -> None:
    assert load_manifest(_manifest(tmp_path, 'kind = "divergence"')).probe.reference == "recorded"
    assert load_manifest(_manifest(tmp_path, 'reference = "live"')).probe.reference == "live"
    spec = load_manifest(_manifest(tmp_path, 'reference = "recs/base.strec"')).probe
    assert spec.reference_file == tmp_path / "recs" / "base.strec"
    with pytest.raises(ManifestError, match="reference"):
        load_manifest(_manifest(tmp_path, 'kind = "recall"\nreference = "base.strec"'))


def test_a_recording_that_does_not_fit_the_probe_is_a_manifest_error(tmp_path: Path) -> None:
    rec = _write(tmp_path / "base.strec")
    probe = ProbeSpec("divergence", None, {**SETTINGS, "lengths": [128]}, reference=str(rec))
    oracle = ServerOracle(TargetSpec(launch=("x", "{port}")), (), probe)
    with pytest.raises(ManifestError, match="lengths"):
        oracle.prepare(None)


def test_workers_get_the_recording_with_the_recipe_and_no_reference_server(tmp_path: Path) -> None:
    rec = _write(tmp_path / "base.strec")
    probe = ProbeSpec("divergence", None, SETTINGS, reference=str(rec))
    oracle = ServerOracle(TargetSpec(launch=("x", "{port}")), (), probe)
    oracle.prepare(tmp_path)
    rec.unlink()  # the worker's node need not see the file: the recipe carries it
    worker = pickle.loads(pickle.dumps(oracle.recipe()))()
    assert worker._recording.digest == oracle._recording.digest
    assert worker.identity() == oracle.identity()
    worker.prepare(None)  # nothing to record or start
    assert worker.recording_launches == 0 and worker.reference_launches == 0 and worker._reference is None


# -- the slow part: real servers ---------------------------------------------------------------


def _serve_manifest(tmp_path: Path, tag: str, reference: str | None) -> Path:
    ref = f'reference = "{reference}"' if reference else ""
    text = f"""
[target]
launch = ["{sys.executable}", "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", "{{port}}",
          "--threads", "1", "--name", "{tag}"]
health = "http://127.0.0.1:{{port}}/health"
start_timeout = 600
config_args = ["--set", "{{key}}={{value}}"]
env = {{ OMP_NUM_THREADS = "1" }}

[[patches]]
name = "fused_rmsnorm"
env = {{ SPEEDTRAP_SMOLMOE_FUSED_RMSNORM = "1" }}
[[patches]]
name = "hash_topk_routed_scaling"
config = {{ apply_routed_scaling_factor_on_output = "true" }}
[[patches]]
name = "lm_head_bf16"
env = {{ SPEEDTRAP_SMOLMOE_LM_HEAD_BF16 = "1" }}

[probe]
kind = "divergence"
preset = "default"
settings = {{ lengths = [64], decode_tokens = 8, bucket_size = 64, top_k = 10 }}
{ref}

[verdict]
metric = "worst.kl_p99"
bound = 0.1
repeats = 0

[search]
prior = ["hash_topk_routed_scaling"]
"""
    path = tmp_path / f"speedtrap-{reference or 'recorded'}.toml"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_recorded_mode_runs_one_server_at_a_time_with_the_side_by_side_verdict(tmp_path: Path) -> None:
    tag = f"st-rec-{uuid.uuid4().hex[:8]}"
    recorded_manifest = load_manifest(_serve_manifest(tmp_path, tag, None))
    live_manifest = load_manifest(_serve_manifest(tmp_path, tag, "live"))
    with ServerWatcher(argv_has(tag.encode(), b"serve")) as watch:
        recorded = isolate(recorded_manifest, tmp_path / "recorded")
    assert watch.seen, "the watcher saw no server of the stack"
    assert watch.most == 1 and watch.most_listening == 1
    assert len(watch.seen) == recorded.launches + 1  # the trials and the one recording launch
    assert (tmp_path / "recorded" / "reference.strec").is_file()
    assert any("recorded" in n for n in recorded.notes)
    with ServerWatcher(argv_has(tag.encode(), b"serve")) as live_watch:
        live = isolate(live_manifest, tmp_path / "live")
    assert live_watch.most == 2  # side by side: the reference server beside a trial's
    assert recorded.status is live.status is Status.FOUND
    assert recorded.culprit_names == live.culprit_names == [("hash_topk_routed_scaling",)]
    assert recorded.interactions == live.interactions
    verdicts = {j.config: j.verdict for j in recorded.judgements}
    assert verdicts == {j.config: j.verdict for j in live.judgements if j.config in verdicts}


def _floor_json(p99: float) -> dict[str, object]:
    from speedtrap.probe import KLStats, NoiseFloor

    kl = [0.0] * 50 + [p99] * 50
    stats = KLStats.of(kl, [True] * len(kl), [])
    return NoiseFloor(stats, stats, stats, exact=False, source="http://gpu-server:8000").to_json()


def test_a_floor_stored_with_the_reference_recording_sets_the_bound(tmp_path: Path) -> None:
    """No verdict.bound: the bound derives from the floor stored in the recording; a bound written wins;
    a recording with no floor (or a live reference) still needs one."""
    from speedtrap.probe import add_extension, load_floor

    rec = _write(tmp_path / "base.strec")
    no_bound = _manifest(tmp_path, 'reference = "base.strec"').read_text().replace("bound = 0.1", "")
    (tmp_path / "derived.toml").write_text(no_bound)
    with pytest.raises(ManifestError, match="record --floor"):
        _ = load_manifest(tmp_path / "derived.toml").verdict
    with pytest.raises(UsageError, match="holds no noise floor"):
        load_floor(rec)
    add_extension(rec, "floor", _floor_json(0.3))
    verdict = load_manifest(tmp_path / "derived.toml").verdict
    assert verdict.bound == pytest.approx(0.6)  # 0.3 + max(0.1, 0.3)
    assert "noise floor of http://gpu-server:8000" in verdict.origin and "base.strec" in verdict.origin
    assert load_floor(rec).overall.kl_p99 == pytest.approx(0.3)
    assert load_manifest(_manifest(tmp_path, 'reference = "base.strec"')).verdict.bound == 0.1
    (tmp_path / "live.toml").write_text(no_bound.replace('"base.strec"', '"live"'))
    with pytest.raises(ManifestError, match=r"verdict\.bound is missing"):
        _ = load_manifest(tmp_path / "live.toml").verdict


def test_an_invalid_stored_floor_is_one_line_on_load(tmp_path: Path) -> None:
    from speedtrap.probe import RecordingError, add_extension, read_recording

    rec = _write(tmp_path / "base.strec")
    add_extension(rec, "floor", {"overall": "not stats"})
    with pytest.raises(RecordingError, match="invalid noise floor"):
        read_recording(rec)
