"""A stack's failure modes are errors naming the role, never passes, hangs or a bare HTTP 500.

The roles are tiny real HTTP servers (tests/isolate/tiny_server.py) whose failures are set by env, and the
router of examples/vllm-pd (proxy.py) where the first request must travel through a real router. Ground truth
is the construction: which role was told to die, hang or break is known, and each test fails on the code
before these fixes (a bare "probe command exited" or "HTTP 500", an empty scratch folder left, the wrong key).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_isolate_roles import PATCHES, PROXY, pd_roles, started, write_stack
from typer.testing import CliRunner

from speedtrap._errors import ManifestError, ServerError
from speedtrap.cli import app
from speedtrap.isolate import Status, isolate
from speedtrap.manifest import load_manifest
from speedtrap.stack import CommandNotFound


def _proxy_router(roles: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    roles["router"] = {
        "launch": [
            *(sys.executable, str(PROXY), "--port", "{port}"),
            *("--prefill", "http://127.0.0.1:{prefill.port}", "--decode", "http://127.0.0.1:{decode.port}"),
        ],
        "after": ["prefill", "decode"],
        "entry": True,
        "runs_model": False,
    }
    return roles


# ----------------------------------------------------------------------------------------------
# SGLang's modes: a role healthy at /health that dies on its first request; a request that hangs.


def test_a_role_that_dies_on_the_first_request_is_named_with_its_log_line(tmp_path: Path) -> None:
    roles = _proxy_router(pd_roles(prefill={"TINY_DIE_ON_REQUEST": "1"}))
    path = write_stack(tmp_path, roles, PATCHES)
    with pytest.raises(ServerError) as caught, started(path, (), tmp_path):
        pass
    text = str(caught.value)
    assert "role 'prefill'" in text and "exited (code 1)" in text, text
    assert "RuntimeError: pin_memory=True requires a CUDA" in text, text  # its log line, in the error
    assert str(caught.value.log).endswith("t.prefill.log")


def test_a_request_that_hangs_behind_the_router_ends_in_time_naming_the_stalled_role(tmp_path: Path) -> None:
    roles = _proxy_router(pd_roles(decode={"TINY_HANG": "1"}))
    path = write_stack(tmp_path, roles, PATCHES, {"request_timeout": 3})
    t0 = time.monotonic()
    with pytest.raises(ServerError) as caught, started(path, (), tmp_path):
        pass
    took = time.monotonic() - t0
    text = str(caught.value)
    assert "role 'decode'" in text and "stalled" in text and "within 3 s" in text, text
    assert took < 3 + 5 * 3 + 10, took  # the request's limit, then at most 5 s per role's health check
    assert str(caught.value.log).endswith("t.decode.log")


def test_a_hang_mid_trial_is_an_error_naming_the_stalled_role(tmp_path: Path) -> None:
    roles = pd_roles(decode={"TINY_HANG": "1"})
    path = write_stack(tmp_path, roles, PATCHES)
    text = path.read_text().replace("timeout = 60", "timeout = 4")  # the probe command's limit
    path.write_text(text)
    result = isolate(load_manifest(path), tmp_path / "run")
    assert result.status is Status.ERROR
    errors = [t.error or "" for t in result.trials if t.error]
    assert errors and all("role 'decode'" in e and "stalled" in e for e in errors), errors


# ----------------------------------------------------------------------------------------------
# vLLM's modes: an engine that dies mid-trial behind a live API server; option spellings; refused launches.


def test_an_engine_that_dies_mid_trial_behind_a_live_server_is_named_with_its_log(tmp_path: Path) -> None:
    roles = pd_roles(decode={"TINY_BREAK_AFTER": "1.5"}, router={"TINY_PROBE_DELAY": "3"})
    result = isolate(load_manifest(write_stack(tmp_path, roles, PATCHES)), tmp_path / "run")
    assert result.status is Status.ERROR
    errors = [t.error or "" for t in result.trials if t.error]
    assert errors and all("role 'decode'" in e and "HTTP 503" in e and "EngineDeadError" in e for e in errors)
    assert all(str(t.log_path).endswith(".decode.log") for t in result.trials if t.error)


@pytest.mark.parametrize("spelling", [["--kv_cache_dtype", "fp8"], ["--kv-cache-dtype=fp8"], ["--kv_cache_dtype=fp8"]])
def test_a_one_sided_setting_is_a_conflict_in_any_spelling(tmp_path: Path, spelling: list[str]) -> None:
    patches = [*PATCHES, {"name": "kv", "args": spelling, "roles": ["decode"]}]
    with pytest.raises(ManifestError, match="conflict"):
        load_manifest(write_stack(tmp_path, pd_roles(), patches, {"agree": ["--kv-cache-dtype"]}))


def test_a_launch_whose_roles_disagree_in_another_spelling_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    roles = pd_roles()
    roles["prefill"]["launch"] = [*roles["prefill"]["launch"], "--kv-cache-dtype", "auto"]
    roles["decode"]["launch"] = [*roles["decode"]["launch"], "--kv_cache_dtype=fp8"]
    path = write_stack(tmp_path, roles, PATCHES, {"agree": ["--kv-cache-dtype"], "scratch": ["kv"]})
    refused = pytest.raises(ManifestError, match=r"disagree on --kv-cache-dtype \(prefill: auto, decode: fp8\)")
    with refused, started(path, (), tmp_path):
        pass
    assert list((tmp_path / "trials").glob("*")) == []  # no empty t.scratch/kv, no log
    assert not (tmp_path / "events.txt").exists()  # no role started


def test_a_missing_role_program_is_named_by_its_role_before_any_role_starts(tmp_path: Path) -> None:
    roles = pd_roles()
    roles["decode"]["launch"] = ["/nonexistent/venv/bin/python", *roles["decode"]["launch"][1:]]
    path = write_stack(tmp_path, roles, PATCHES, {"scratch": ["kv"]})
    refused = pytest.raises(CommandNotFound, match=r"target\.roles\.decode\.launch\[0\]: command '/nonexistent")
    with refused, started(path, (), tmp_path):
        pass
    assert not (tmp_path / "events.txt").exists()  # the prefill was not started first
    assert list((tmp_path / "trials").glob("*")) == []


# ----------------------------------------------------------------------------------------------
# An inconclusive hunt is not a success.


def test_an_inconclusive_hunt_exits_non_zero_saying_what_to_change(tiny_manifest: Any, tmp_path: Path) -> None:
    # the broken configurations' figure (1.0) lands in the "near" band of the bound (0.9 +- 0.45), repeats = 0
    manifest = tiny_manifest(["p0", "p1"], [{"all": ["p1"]}], verdict={"bound": 0.9, "near": 0.5, "repeats": 0})
    out = CliRunner().invoke(app, ["bisect", "--manifest", str(manifest), "--run-dir", str(tmp_path / "r")])
    assert out.exit_code == 1, out.output
    assert "inconclusive" in out.output and "repeats" in out.output and "bound" in out.output, out.output
    again = CliRunner().invoke(
        app, ["bisect", "--manifest", str(manifest), "--run-dir", str(tmp_path / "r"), "--resume", "--json"]
    )
    assert again.exit_code == 1 and json.loads(again.stdout)["status"] == "inconclusive"
