"""``speedtrap bisect``: JSON on stdout, one-line errors with exit code 2."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from speedtrap.cli import app

PATCHES = ["a", "b", "c", "d"]


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["bisect", *args])
    return result.exit_code, result.stdout, result.stderr


def test_bisect_with_a_manifest_prints_the_verdict_as_json(tiny_manifest: Callable[..., Path], tmp_path: Path) -> None:
    manifest = tiny_manifest(PATCHES, [{"all": ["b", "d"]}])
    code, out, err = _run("--manifest", str(manifest), "--run-dir", str(tmp_path / "run"), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["status"] == "found" and [c["patches"] for c in data["culprits"]] == [["b", "d"]]
    assert [i["kind"] for i in data["interactions"]] == ["joint"]  # b and d fail only together
    assert data["launches"] == len(data["trials"]) and all(t["log_path"] for t in data["trials"])
    assert {tuple(t["config"]) for t in data["trials"]} >= {(), ("a", "b", "c", "d"), ("b",), ("d",)}
    # The human form names the culprit too.
    code, out, _ = _run("--manifest", str(manifest), "--run-dir", str(tmp_path / "run"))
    assert code == 0 and "culprit: b + d" in out and "reused from the store: " in out


def test_bad_input_is_one_line_and_exit_code_2(tiny_manifest: Callable[..., Path], tmp_path: Path) -> None:
    code, _, err = _run("--target", "smol-moe", "--manifest", "x.toml")
    assert code == 2 and "exactly one of --target or --manifest" in err
    bad = tmp_path / "bad.toml"
    bad.write_text('[target]\nlaunch = ["server"]\n[[patches]]\nname = "a"\n')
    code, _, err = _run("--manifest", str(bad), "--run-dir", str(tmp_path / "r1"))
    assert code == 2 and "target.launch has no {port} placeholder" in err and "Traceback" not in err
    missing = tiny_manifest(PATCHES, [], target={"launch": ["/no/such/binary", "--port", "{port}"]}, name="m.toml")
    code, _, err = _run("--manifest", str(missing), "--run-dir", str(tmp_path / "r2"))
    assert code == 2 and "target.launch[0]: command '/no/such/binary' not found" in err


def test_a_server_that_never_becomes_healthy_stops_the_run_naming_its_log(
    tiny_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    manifest = tiny_manifest(PATCHES, [], env={"TINY_NEVER_HEALTHY": "1"}, target={"start_timeout": 1, "retries": 0})
    code, out, err = _run("--manifest", str(manifest), "--run-dir", str(tmp_path / "run"), "--json")
    assert code == 0, err  # the search ran, and says why it stopped
    data = json.loads(out)
    assert data["status"] == "error" and "baseline's verdict is error" in data["message"]
    (trial,) = data["trials"]
    assert trial["status"] == "failed" and "did not become healthy" in trial["error"]
    assert trial["log_path"] and Path(trial["log_path"]).exists() and trial["log_path"] in trial["error"]
    assert trial["log_path"] in data["message"]
