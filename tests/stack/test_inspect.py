"""``speedtrap inspect`` against real processes started here: gates on, secrets redacted, bad pids."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedtrap._redact import redact_argv, redact_env
from speedtrap.cli import app

SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123"
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def server() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in for `speedtrap serve`: a real process with two patch env vars, a secret and a flag."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "SPEEDTRAP_SMOLMOE_MHC_BF16_GEMM": "1",
        "SPEEDTRAP_SMOLMOE_FP8_KV_CACHE": "1",
        "SPEEDTRAP_SMOLMOE_LM_HEAD_BF16": "0",
        "HF_TOKEN": SECRET,
        "SGLANG_ENABLE_SOMETHING": "1",
        "PYTHONPATH": "/tmp/speedtrap-worktree-0001",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--chunked-prefill-size", "256", "--api-key", "s3cr3t"],
        env=env,
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_inspect_names_exactly_the_two_patches_and_redacts(server: subprocess.Popen[bytes]) -> None:
    result = CliRunner().invoke(app, ["inspect", "--pid", str(server.pid), "--target", "smol-moe", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert sorted(data["patches_on"]) == ["fp8_kv_cache", "mhc_bf16_gemm"]
    states = {g["patch"]: g["state"] for g in data["gates"]}
    assert states["lm_head_bf16"] == "off" and states["hash_topk_routed_scaling"] == "unknown"
    assert data["env"]["HF_TOKEN"] == "<redacted>" and "HF_TOKEN" in data["redacted"]
    assert data["other_switches"] == {"SGLANG_ENABLE_SOMETHING": "1", "PYTHONPATH": "/tmp/speedtrap-worktree-0001"}
    assert SECRET not in result.output and "s3cr3t" not in result.output
    assert data["argv"][-2:] == ["--api-key", "<redacted>"]
    human = CliRunner().invoke(app, ["inspect", "--pid", str(server.pid)])
    assert human.exit_code == 0 and "patches on: mhc_bf16_gemm, fp8_kv_cache" in human.output
    assert SECRET not in human.output
    # The text shows what --json shows of the launch: its flags (secrets hidden) and the worktree on PYTHONPATH.
    assert "--chunked-prefill-size 256 --api-key <redacted>" in human.output
    assert "PYTHONPATH=/tmp/speedtrap-worktree-0001" in human.output


def test_inspect_with_a_manifest_reads_flags_too(server: subprocess.Popen[bytes], tmp_path: Path) -> None:
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(
        textwrap.dedent(
            """\
        [[patches]]
        name = "mhc"
        env = { SPEEDTRAP_SMOLMOE_MHC_BF16_GEMM = "1" }
        [[patches]]
        name = "chunked"
        args = ["--chunked-prefill-size=256"]
        [[patches]]
        name = "other_flag"
        args = ["--enable-dp-attention"]
        [[patches]]
        name = "token_gate"
        env = { HF_TOKEN = "1" }
        """
        )
    )
    result = CliRunner().invoke(app, ["inspect", "--pid", str(server.pid), "--manifest", str(manifest), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["patches_on"] == ["mhc", "chunked"]
    assert SECRET not in result.output


def test_pid_that_does_not_exist() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that existed and is gone
    result = CliRunner().invoke(app, ["inspect", "--pid", str(proc.pid)])
    assert result.exit_code == 2 and f"no process with pid {proc.pid}" in result.output
    assert "Traceback" not in result.output


def test_pid_that_is_not_readable(server: subprocess.Popen[bytes]) -> None:
    if os.geteuid() != 0:
        result = CliRunner().invoke(app, ["inspect", "--pid", "1"])
        assert result.exit_code == 2 and "permission denied" in result.output
        return
    # As root everything is readable: read the root-owned server as the unprivileged user nobody.
    python = shutil.which("python3.11", path="/usr/bin")
    if python is None:
        pytest.skip("no system python3.11 that user nobody can run")
    code = (
        "import sys\nfrom speedtrap._errors import SpeedtrapError\nfrom speedtrap.stack import read_process\n"
        f"try:\n    read_process({server.pid})\nexcept SpeedtrapError as e:\n    print(e.one_line()); sys.exit(2)\n"
    )
    try:
        out = subprocess.run(
            [python, "-c", code],
            env={"PYTHONPATH": str(SRC)},
            user="nobody",
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
    except PermissionError:
        pytest.skip("cannot switch to user nobody here")
    if "ModuleNotFoundError" in out.stderr or "Permission denied: '" in out.stderr:
        pytest.skip(f"user nobody cannot import speedtrap from {SRC}")
    assert out.returncode == 2, out.stderr
    assert "permission denied (the process belongs to another user)" in out.stdout


def test_bad_ssh_host_is_refused_before_running_ssh() -> None:
    result = CliRunner().invoke(app, ["inspect", "--pid", "1", "--ssh", "-oProxyCommand=touch /tmp/x"])
    assert result.exit_code == 2 and "is not a host name" in result.output


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_unreachable_ssh_host_is_a_clear_error() -> None:
    result = CliRunner().invoke(app, ["inspect", "--pid", "1", "--ssh", "nobody@127.0.0.1:1"])
    assert result.exit_code == 2 and "ssh to nobody@127.0.0.1:1 failed" in result.output


def test_redaction_rules() -> None:
    env, hidden = redact_env(
        {
            "OPENAI_API_KEY": "x",
            "DB_PASSWORD": "y",
            "PLAIN": SECRET,
            "HOME": "/root",
            "PROXY": "http://user:pw@proxy:8080",
            "SPEEDTRAP_X": "1",
        }
    )
    assert hidden == ["DB_PASSWORD", "OPENAI_API_KEY", "PLAIN"]
    assert env["HOME"] == "/root" and env["SPEEDTRAP_X"] == "1" and "pw@" not in env["PROXY"]
    assert redact_argv(["serve", "--hf-token=abc", "--token", "t", "--model", "m", SECRET]) == [
        "serve",
        "--hf-token=<redacted>",
        "--token",
        "<redacted>",
        "--model",
        "m",
        "<redacted>",
    ]


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("GITHUB_TOKEN", True),
        ("NPM_AUTHTOKEN", True),
        ("OPENAI_API_KEY", True),
        ("SPEEDTRAP_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("PGPASSWORD", True),
        ("MYSQL_PASSWD", True),
        ("DB_PWD", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("AUTHORIZATION", True),
        ("SESSION_ID", True),
        ("COOKIE_JAR", True),
        ("--hf-token", True),
        ("--api-key", True),
        # Working directories, and names that only contain a secret word inside another word.
        ("PWD", False),
        ("OLDPWD", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("GIT_AUTHOR_NAME", False),
        ("MONKEY_PATCH", False),
        ("KEYBOARD", False),
        ("HOME", False),
        ("VLLM_PLUGINS", False),
        ("SPEEDTRAP_SMOLMOE_FP8_KV_CACHE", False),
        # Counts of tokens are serving settings (SGLang's and vLLM's launch flags), not secrets.
        ("--max-total-tokens", False),
        ("--max-num-batched-tokens", False),
        ("MAX_NEW_TOKENS", False),
        ("GITHUB_TOKENS", True),
    ],
)
def test_secret_name_rule(name: str, secret: bool) -> None:
    from speedtrap._redact import secret_name

    assert secret_name(name) is secret


def test_working_directories_are_shown_not_redacted() -> None:
    env, hidden = redact_env({"PWD": "/srv/app", "OLDPWD": "/root", "HF_TOKEN": "hf_abcdefghijk"})
    assert hidden == ["HF_TOKEN"]
    assert env["PWD"] == "/srv/app" and env["OLDPWD"] == "/root"


ENTRY_POINTS = """\
[console_scripts]
tool = example_plugin.cli:main

[vllm.general_plugins]
example_patches = example_plugin:register
other = example_plugin.other:register
"""


def _mapping_host(site: Path, mapped: Path) -> subprocess.Popen[bytes]:
    (site / "example_plugin-0.1.0.dist-info").mkdir(parents=True)
    (site / "example_plugin-0.1.0.dist-info" / "entry_points.txt").write_text(ENTRY_POINTS)
    mapped.parent.mkdir(parents=True, exist_ok=True)
    mapped.write_bytes(b"\0" * 4096)
    code = "import mmap, sys, time; f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); "
    code += "print('mapped', flush=True); time.sleep(60)"
    env = {"PATH": os.environ.get("PATH", ""), "VLLM_PLUGINS": "example_patches", "SPEEDTRAP_VLLM_X": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, str(mapped)], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"mapped\n"
    return proc


@pytest.fixture
def plugin_host(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real process with a file of an installed vllm package mapped (as vLLM maps its compiled ops);
    the folder declares two vLLM general plugins, and VLLM_PLUGINS selects one of them."""
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    proc = _mapping_host(site, site / "vllm" / "_C.abi3.so")
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_vllm_plugin_is_not_loaded_in_a_process_that_is_not_vllm(tmp_path: Path) -> None:
    """The same plugins installed beside another server (as smg-grpc-servicer's sits in SGLang's venv):
    that process maps only torch-like libraries, so vLLM's plugin groups are never read there."""
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    proc = _mapping_host(site, site / "torch" / "lib" / "libmapped.so")
    try:
        result = CliRunner().invoke(app, ["inspect", "--pid", str(proc.pid), "--json"])
        human = CliRunner().invoke(app, ["inspect", "--pid", str(proc.pid)])
    finally:
        proc.kill()
        proc.wait()
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["plugins_loaded"] == []
    assert {p["name"]: p["loaded"] for p in data["plugins"]} == {"example_patches": False, "other": False}
    assert {p["reason"] for p in data["plugins"]} == {"this process is not vLLM"}
    assert "plugin example_patches" in human.output and "not loaded: this process is not vLLM" in human.output


def test_a_process_runs_vllm_by_its_module_its_script_or_its_mapped_files() -> None:
    from speedtrap.stack._plugins import runs_vllm

    assert runs_vllm(["python", "-m", "vllm.entrypoints.openai.api_server"], None)
    assert runs_vllm(["/v/bin/vllm", "serve", "m"], None)
    assert not runs_vllm(["python", "-m", "sglang.launch_server"], None)
    maps = "7f0-7f1 r--p 0 08:01 12 /v/lib/python3.11/site-packages/vllm/_C.abi3.so\n"
    assert runs_vllm(["python", "x.py"], maps)
    assert not runs_vllm(["python", "x.py"], maps.replace("/vllm/", "/sglang/"))


def test_inspect_names_the_vllm_plugins_the_process_loads(plugin_host: subprocess.Popen[bytes]) -> None:
    result = CliRunner().invoke(app, ["inspect", "--pid", str(plugin_host.pid), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["plugins_loaded"] == ["example_patches"]
    by_name = {p["name"]: p for p in data["plugins"]}
    assert by_name.keys() == {"example_patches", "other"}  # console_scripts is not a plugin group
    assert by_name["example_patches"] == {
        "group": "vllm.general_plugins",
        "name": "example_patches",
        "target": "example_plugin:register",
        "distribution": "example_plugin 0.1.0",
        "loaded": True,
        "reason": "",
    }
    assert not by_name["other"]["loaded"]
    human = CliRunner().invoke(app, ["inspect", "--pid", str(plugin_host.pid)])
    assert "plugin example_patches (vllm.general_plugins: example_plugin:register" in human.output
    assert "plugin other" in human.output and "not loaded: not selected by VLLM_PLUGINS" in human.output


def test_vllm_plugins_selection_follows_vllm() -> None:
    from speedtrap.stack._plugins import process_plugins, selected, site_dirs

    assert selected({}) is None and selected({"VLLM_PLUGINS": "a,b"}) == ["a", "b"]
    assert selected({"VLLM_PLUGINS": ""}) == [""]  # set but empty: vLLM loads none
    maps = "7f0-7f1 r--p 00000000 08:01 12 /v/lib/python3.11/site-packages/torch/lib/libc10.so\n7f2-7f3 rw-p 0 0 0\n"
    assert site_dirs(maps) == [Path("/v/lib/python3.11/site-packages")]
    assert process_plugins(None, {"VLLM_PLUGINS": "x"})[0].name == "x"  # remote: what VLLM_PLUGINS asks for


@given(st.text(max_size=400))
@settings(max_examples=200, deadline=None)
def test_any_maps_text_reads_as_site_folders_or_nothing(maps: str) -> None:
    from speedtrap.stack._plugins import site_dirs

    assert all(d.name in ("site-packages", "dist-packages") for d in site_dirs(maps))


def test_inspect_without_a_patch_list_claims_no_catalogue_for_a_foreign_server() -> None:
    """A server that carries none of smol-moe's gates (SGLang, vLLM) is not said to run smol-moe's patches "off"."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={"SGLANG_USE_CPU_ENGINE": "1"})
    try:
        result = CliRunner().invoke(app, ["inspect", "--pid", str(proc.pid), "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["gates"] == [] and "no patch list compared" in data["note"]
        assert data["other_switches"] == {"SGLANG_USE_CPU_ENGINE": "1"}
        named = CliRunner().invoke(app, ["inspect", "--pid", str(proc.pid), "--target", "smol-moe", "--json"])
        assert len(json.loads(named.stdout)["gates"]) == 8  # asked for by name: compared, every gate off
    finally:
        proc.kill()
        proc.wait()
