"""Multi-process stacks (``target.roles``): parsing, launch order, per-role switches, failures, no orphans.

The roles are tiny real HTTP servers (tests/isolate/tiny_server.py) and the router of examples/vllm-pd
(proxy.py, FastAPI + httpx); ground truth is what each process reports about itself (its events file, its
pid, /proc/PID/environ) and the kernel's (pids gone, ports refusing), never speedtrap's own account.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
from _toml_text import toml_text
from hypothesis import given
from hypothesis import strategies as st

from speedtrap._errors import ManifestError, ServerError
from speedtrap.isolate import Status, isolate
from speedtrap.isolate._oracle import ServerOracle
from speedtrap.manifest import load_manifest
from speedtrap.stack._roles import _placeholders

ROOT = Path(__file__).resolve().parents[2]
TINY_SERVER = Path(__file__).with_name("tiny_server.py")
TINY_PROBE = Path(__file__).with_name("tiny_probe.py")
PROXY = ROOT / "examples" / "vllm-pd" / "proxy.py"


def _tiny_role(role: str, **env: str) -> dict[str, Any]:
    return {"launch": [sys.executable, str(TINY_SERVER), "--port", "{port}"], "env": {"TINY_ROLE": role, **env}}


def write_stack(
    tmp_path: Path,
    roles: dict[str, dict[str, Any]],
    patches: list[dict[str, Any]],
    target: dict[str, Any] | None = None,
    name: str = "speedtrap.toml",
) -> Path:
    tables: dict[str, dict[str, Any]] = {
        "target": {"start_timeout": 30, "stop_timeout": 5, "env": {"TINY_EVENTS": str(tmp_path / "events.txt")}}
    }
    tables["target"].update(target or {})
    for role, table in roles.items():
        tables[f"target.roles.{role}"] = table
    tables["probe"] = {"kind": "command", "argv": [sys.executable, str(TINY_PROBE), "{base_url}"], "timeout": 60}
    tables["verdict"] = {"metric": "metric", "bound": 0.5, "near": 0.0, "repeats": 0}
    path = tmp_path / name
    path.write_text(toml_text(tables, patches))
    return path


def pd_roles(**extra: dict[str, str]) -> dict[str, dict[str, Any]]:
    """prefill and decode (tiny servers, p1 breaks either), a router (tiny) reporting the worst of them."""
    fails = json.dumps([{"all": ["p1"]}])
    return {
        "prefill": _tiny_role("prefill", TINY_FAILS=fails, **extra.get("prefill", {})),
        "decode": _tiny_role("decode", **extra.get("decode", {})),
        "router": {
            **_tiny_role(
                "router",
                TINY_UPSTREAM="http://127.0.0.1:{prefill.port},http://127.0.0.1:{decode.port}",
                **extra.get("router", {}),
            ),
            "after": ["prefill", "decode"],
            "entry": True,
            "runs_model": False,
        },
    }


PATCHES = [
    {"name": "p1", "env": {"TINY_P_P1": "1"}, "split": True},
    {"name": "p2", "env": {"TINY_P_P2": "1"}, "roles": ["decode"]},
    {"name": "p3", "env": {"TINY_P_P3": "1"}},
]


def _events(tmp_path: Path) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for line in (tmp_path / "events.txt").read_text().splitlines():
        role, what, when, _pid = line.split()
        out.setdefault(role, {})[what] = float(when)
    return out


def _environ(pid: int) -> dict[str, str]:
    data = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in data.decode().split("\0") if "=" in item)


def _server_pid(guard_pid: int) -> int:
    """The guard's child: the role's server process (the kernel's record, not speedtrap's)."""
    children = Path(f"/proc/{guard_pid}/task/{guard_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _refuses(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


# ----------------------------------------------------------------------------------------------
# The manifest.


def test_roles_split_and_defaults_in_the_manifest(tmp_path: Path) -> None:
    manifest = load_manifest(write_stack(tmp_path, pd_roles(), PATCHES))
    stack = manifest.target.stack
    assert stack is not None and stack.entry.name == "router"
    assert stack.model_roles == ("prefill", "decode")
    assert stack.start_order() == [["prefill", "decode"], ["router"]]
    assert [(p.name, p.roles) for p in manifest.patches] == [
        ("p1@prefill", ("prefill",)),
        ("p1@decode", ("decode",)),
        ("p2", ("decode",)),
        ("p3", ()),  # every role that runs the model
    ]
    assert manifest.patch("p1@decode").switch()["roles"] == ["decode"]
    assert "roles" not in manifest.patch("p3").switch()  # earlier runs' trial keys hold


def test_a_single_launch_target_is_still_a_stack_of_one(tiny_manifest: Any) -> None:
    manifest = load_manifest(tiny_manifest(["p0"], []))
    assert manifest.target.stack is None and manifest.target.launch


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r, p, t: r["router"].pop("entry"), "exactly one entry role"),
        (lambda r, p, t: r["prefill"].update(after=["router"]), "cycle"),
        (lambda r, p, t: r["decode"].update(after=["nobody"]), "names no other role"),
        (lambda r, p, t: r["decode"]["env"].update(X="{port.nope}"), "not a placeholder"),
        (lambda r, p, t: p.append({"name": "q", "env": {"Q": "1"}, "roles": ["gpu"]}), "names no role"),
        (lambda r, p, t: p.append({"name": "q", "env": {"Q": "1"}, "roles": ["decode"], "split": True}), "two roles"),
        (lambda r, p, t: p.append({"name": "kv", "args": ["--kv-dtype", "fp8"], "split": True}), "conflict"),
        (lambda r, p, t: p.append({"name": "kv", "env": {"PAGE": "64"}, "roles": ["decode"]}), "conflict"),
        (lambda r, p, t: r["router"].update(launch=["x"]), "no {port}"),
        (lambda r, p, t: t.update(launch=["x", "{port}"]), "both launch and roles"),
    ],
)
def test_bad_stacks_are_one_line_errors(tmp_path: Path, change: Any, says: str) -> None:
    roles, patches = pd_roles(), [dict(p) for p in PATCHES]
    target: dict[str, Any] = {"agree": ["--kv-dtype", "PAGE"]}
    change(roles, patches, target)
    with pytest.raises(ManifestError, match=says):
        load_manifest(write_stack(tmp_path, roles, patches, target))


def test_a_setting_that_must_agree_may_be_switched_on_every_model_role(tmp_path: Path) -> None:
    patches = [*PATCHES, {"name": "kv", "args": ["--kv-dtype", "fp8"]}]
    manifest = load_manifest(write_stack(tmp_path, pd_roles(), patches, {"agree": ["--kv-dtype"]}))
    assert manifest.patch("kv").roles == ()


@given(st.text(alphabet="{}ab.port_-1 ", max_size=30))
def test_placeholders_are_read_from_any_text(text: str) -> None:
    for key in _placeholders(text):
        assert "{" + key + "}" in text and key


# ----------------------------------------------------------------------------------------------
# One stack, launched.


@contextlib.contextmanager
def started(manifest_path: Path, config: tuple[str, ...], tmp_path: Path) -> Iterator[Any]:
    manifest = load_manifest(manifest_path)
    oracle = ServerOracle(manifest.target, manifest.patches, manifest.probe)
    stack, _ = oracle.start_stack(config, tmp_path / "trials" / "t.log")
    try:
        yield stack
    finally:
        stack.stop()


def test_roles_start_in_order_each_with_its_own_switches(tmp_path: Path) -> None:
    roles = pd_roles(prefill={"TINY_START_DELAY": "1.0"})
    with started(write_stack(tmp_path, roles, PATCHES), ("p1@prefill", "p2", "p3"), tmp_path) as stack:
        events = _events(tmp_path)
        # prefill and decode in parallel (decode started before prefill was ready), the router after both.
        assert events["decode"]["start"] < events["prefill"]["ready"]
        assert events["router"]["start"] >= max(events["prefill"]["ready"], events["decode"]["ready"])
        env = {role: _environ(_server_pid(pid)) for role, pid in stack.pids().items()}
        assert "TINY_P_P1" in env["prefill"] and "TINY_P_P1" not in env["decode"]
        assert "TINY_P_P2" in env["decode"] and "TINY_P_P2" not in env["prefill"]
        assert "TINY_P_P3" in env["prefill"] and "TINY_P_P3" in env["decode"] and "TINY_P_P3" not in env["router"]
        assert env["router"]["TINY_UPSTREAM"] == (
            f"http://127.0.0.1:{stack.launches['prefill'].port},http://127.0.0.1:{stack.launches['decode'].port}"
        )
        pids = {role: _server_pid(pid) for role, pid in stack.pids().items()}
    assert all(_gone(pid) for pid in pids.values())


def test_scratch_folders_are_fresh_for_every_launch(tmp_path: Path) -> None:
    roles = pd_roles()
    roles["prefill"]["env"]["KV"] = "{scratch.kv}"
    path = write_stack(tmp_path, roles, PATCHES, {"scratch": ["kv"]})
    with started(path, (), tmp_path) as stack:
        kv = Path(stack.launches["prefill"].spec.env["KV"])
        assert kv.is_dir() and not any(kv.iterdir())
        (kv / "stale-block").write_text("the baseline's KV")
    assert not kv.exists()
    with started(path, (), tmp_path) as stack:
        assert Path(stack.launches["prefill"].spec.env["KV"]) == kv and not any(kv.iterdir())


def test_a_role_that_exits_at_start_is_an_error_naming_it(tmp_path: Path) -> None:
    roles = pd_roles(decode={"TINY_DIE_AFTER": "0"})
    roles["router"]["env"]["TINY_START_DELAY"] = "2"  # decode dies while the router is starting
    path = write_stack(tmp_path, roles, PATCHES)
    with pytest.raises(ServerError, match=r"role 'decode'") as caught, started(path, (), tmp_path):
        pass
    assert str(caught.value.log).endswith("t.decode.log")


def test_a_role_dying_mid_trial_fails_the_trial_naming_it(tmp_path: Path) -> None:
    roles = pd_roles(decode={"TINY_DIE_AFTER": "1.5"}, router={"TINY_PROBE_DELAY": "3"})
    manifest = load_manifest(write_stack(tmp_path, roles, PATCHES))
    result = isolate(manifest, tmp_path / "run")
    assert result.status is Status.ERROR
    errors = [t.error for t in result.trials if t.error]
    assert errors and all("role 'decode'" in str(e) for e in errors), errors
    assert all(str(t.log_path).endswith(".decode.log") for t in result.trials if t.error)  # the role's own log


def test_healthy_roles_whose_first_request_fails_end_the_trial_as_an_error(tmp_path: Path) -> None:
    roles = pd_roles(decode={"TINY_COMPLETIONS_500": "1"})
    roles["router"] = {
        "launch": [
            *(sys.executable, str(PROXY), "--port", "{port}"),
            *("--prefill", "http://127.0.0.1:{prefill.port}", "--decode", "http://127.0.0.1:{decode.port}"),
        ],
        "after": ["prefill", "decode"],
        "entry": True,
        "runs_model": False,
    }
    path = write_stack(tmp_path, roles, PATCHES)
    with pytest.raises(ServerError) as caught, started(path, (), tmp_path):
        pass
    text = str(caught.value)
    assert "entry role 'router'" in text and "HTTP 500" in text
    assert "roles that wrote to their log meanwhile: prefill" in text and "decode (" in text
    assert str(caught.value.log).endswith("t.prefill.log") or str(caught.value.log).endswith("t.decode.log")


def test_inspect_of_the_manifest_finds_every_role_and_its_processes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from speedtrap.cli import app

    roles = pd_roles(decode={"TINY_CHILD": "1"})
    path = write_stack(tmp_path, roles, PATCHES)
    with started(path, ("p1@prefill", "p2"), tmp_path) as stack:
        out = CliRunner().invoke(app, ["inspect", "--manifest", str(path), "--json"])
        assert out.exit_code == 0, out.output
        report = json.loads(out.output)
        by_role = {r["role"]: r for r in report["roles"]}
        assert set(by_role) == {"prefill", "decode", "router"}
        for role, guard in stack.pids().items():
            leader = _server_pid(guard)
            assert by_role[role]["guard_pid"] == guard and by_role[role]["leader"]["pid"] == leader
        child = int(
            Path(f"/proc/{_server_pid(stack.pids()['decode'])}/task/{_server_pid(stack.pids()['decode'])}/children")
            .read_text()
            .split()[0]
        )
        assert [p["pid"] for p in by_role["decode"]["processes"]] == [_server_pid(stack.pids()["decode"]), child]
        assert by_role["decode"]["unreadable"] == [child] and by_role["prefill"]["unreadable"] == []
        assert by_role["prefill"]["patches_on"] == ["p1@prefill"]
        assert by_role["decode"]["patches_on"] == ["p2"]  # p1@prefill is not a gate of the decode
        assert by_role["router"]["gates"] == []  # no patch applies to the router
        assert set(by_role["prefill"]["switches"]) <= {"PYTHONPATH"} and "--port" in by_role["prefill"]["argv"]
        text = CliRunner().invoke(app, ["inspect", "--manifest", str(path)]).output
        assert f"pid {child}" in text and "environment unreadable" in text
        # each role's launch line is in the text too, with its own port (not only in --json)
        for role, row in by_role.items():
            assert f"--port {row['port']}" in text, role
    out = CliRunner().invoke(app, ["inspect", "--manifest", str(path)])
    assert out.exit_code == 2 and "no live stack" in out.output


# ----------------------------------------------------------------------------------------------
# The search over role switches, against brute force.


def test_bisect_names_the_prefill_half_and_agrees_with_brute_force(tmp_path: Path) -> None:
    manifest = load_manifest(write_stack(tmp_path, pd_roles(), PATCHES))
    names = [p.name for p in manifest.patches]
    oracle = ServerOracle(manifest.target, manifest.patches, manifest.probe)
    brute: dict[tuple[str, ...], bool] = {}
    for size in (1,):
        for config in combinations(names, size):
            with oracle.start_stack(config, tmp_path / "brute" / f"{'+'.join(config)}.log")[0] as stack:
                url = f"http://127.0.0.1:{stack.port}"
                argv = [sys.executable, str(TINY_PROBE), url]
                done = subprocess.run(argv, capture_output=True, text=True, check=True)
                brute[config] = json.loads(done.stdout)["metric"] > 0.5
    assert [c for c, bad in brute.items() if bad] == [("p1@prefill",)]  # by construction, measured
    result = isolate(manifest, tmp_path / "run")
    assert result.status is Status.FOUND
    assert result.culprit_names == [("p1@prefill",)]
    stored = json.loads((tmp_path / "run" / "result.json").read_text())
    assert "p1@prefill" in json.dumps(stored["culprits"])


# ----------------------------------------------------------------------------------------------
# kill -9 of speedtrap: every role goes.


def test_sigkill_of_speedtrap_mid_trial_leaves_no_role_running(tmp_path: Path) -> None:
    pids = tmp_path / "pids.txt"
    stay = {"TINY_STAY": "1", "TINY_PIDS": str(pids)}
    roles = pd_roles(prefill=stay, decode=stay, router={**stay, "TINY_PROBE_DELAY": "30"})
    manifest = write_stack(tmp_path, roles, PATCHES)
    log = open(tmp_path / "owner.log", "ab")  # noqa: SIM115  (closed with the process)
    owner = subprocess.Popen(
        [sys.executable, "-m", "speedtrap", "bisect", "--manifest", str(manifest), "--run-dir", str(tmp_path / "r")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log.close()
    servers: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = [line.split() for line in pids.read_text().splitlines()] if pids.exists() else []
            servers = [(int(a), int(b)) for a, b in rows]
            if len(servers) >= 3 and all(not _refuses(port) for _, port in servers):
                break
            assert owner.poll() is None, (tmp_path / "owner.log").read_text()
            time.sleep(0.2)
        assert len(servers) >= 3, servers
        time.sleep(0.5)  # the probe is now waiting on the router
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(_gone(p) and _refuses(port) for p, port in servers):
            time.sleep(0.2)
        assert [(p, port) for p, port in servers if not (_gone(p) and _refuses(port))] == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(owner.pid, signal.SIGKILL)
        for pid, _ in servers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
