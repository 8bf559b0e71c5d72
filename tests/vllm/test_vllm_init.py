"""``speedtrap init --pid`` on a vLLM server started by hand from a git checkout, then ``speedtrap run`` on what it
wrote, unedited.

A ``stack`` benchmark (not in CI: a whole hunt of several vLLM launches). The checkout is vLLM's package as
installed with three commits on it (the ones of tests/isolate/test_isolate_commits_vllm.py): ``mlp_scale`` doubles
every Llama MLP's output (the culprit, by construction), the two others edit comments. The server runs the
checkout's HEAD (every commit in) with the example plugin's harmless gate ``SPEEDTRAP_VLLM_SILU_NATIVE=1`` and
``--max-num-batched-tokens 256`` (a speed flag); init must make both patches, and the run must name the culprit
commit alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
import vllm_stack

from speedtrap.stack import free_port


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env,
                          check=True).stdout.strip()  # fmt: skip


def commit_edit(repo: Path, rel: str, old: str, new: str, subject: str) -> str:
    path = repo / rel
    text = path.read_text()
    assert text.count(old) == 1, (rel, old)
    path.write_text(text.replace(old, new))
    git(repo, "commit", "-q", "-am", subject)
    return git(repo, "rev-parse", "HEAD")


def build_repo(python: Path, repo: Path) -> dict[str, str]:
    code = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('vllm').origin))"
    package = Path(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip())
    for path in package.rglob("*"):
        rel = path.relative_to(package)
        if "__pycache__" in rel.parts or path.is_dir():
            continue
        target = repo / "vllm" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".so":
            target.symlink_to(path.resolve())
        else:
            shutil.copy2(path, target)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "vllm as installed")
    shas = {"base": git(repo, "rev-parse", "HEAD")}
    llama = "vllm/model_executor/models/llama.py"
    shas["attn_comment"] = commit_edit(
        repo, llama, "class LlamaAttention(nn.Module):\n",
        "# Attention: rotary embedding, paged KV cache.\nclass LlamaAttention(nn.Module):\n",
        "llama: a comment on the attention block",
    )  # fmt: skip
    shas["mlp_scale"] = commit_edit(
        repo, llama, "        x, _ = self.down_proj(x)\n        return x\n",
        "        x, _ = self.down_proj(x)\n        x = x * 2.0  # residual scale, fused here\n        return x\n",
        "llama: fuse the residual scale into the MLP output",
    )  # fmt: skip
    shas["attn_comment_more"] = commit_edit(
        repo, llama, "# Attention: rotary embedding, paged KV cache.\n",
        "# Attention: rotary embedding, paged KV cache, CPU backend.\n", "llama: say which backend",
    )  # fmt: skip
    return shas


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_init_from_a_hand_started_vllm_then_run_names_the_culprit_commit(tmp_path: Path) -> None:
    python, model = vllm_stack.ensure_stack()
    repo = tmp_path / "vllm-src"
    shas = build_repo(python, repo)
    port = free_port()
    argv = vllm_stack.vllm_argv(python, model, port, "--max-num-batched-tokens", "256")
    env = vllm_stack.vllm_env(SPEEDTRAP_VLLM_SILU_NATIVE="1")
    env["PYTHONPATH"] = str(repo)  # the checkout at HEAD: every commit in
    log = (tmp_path / "hand.log").open("wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    manifest = tmp_path / "speedtrap.toml"
    try:
        deadline = time.monotonic() + vllm_stack.START_TIMEOUT
        while True:
            assert proc.poll() is None, (tmp_path / "hand.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the hand-started vLLM did not get healthy"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                time.sleep(2)
        up_s = time.monotonic() - t0
        t1 = time.monotonic()
        init = [sys.executable, "-m", "speedtrap", "init", "--pid", str(proc.pid), "--since", shas["base"]]
        done = subprocess.run([*init, "--out", str(manifest)], capture_output=True, text=True, check=False)
        init_s = time.monotonic() - t1
        assert done.returncode == 0, done.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    text = manifest.read_text()
    print(f"hand vLLM up in {up_s:.0f} s; init {init_s:.1f} s\n{text}", flush=True)
    assert "# TODO" not in text
    data = tomllib.loads(text)
    names = {p.get("commit") or p.get("env", {}).get("SPEEDTRAP_VLLM_SILU_NATIVE") or " ".join(p.get("args", [])):
             p["name"] for p in data["patches"]}  # fmt: skip
    assert {shas["attn_comment"], shas["mlp_scale"], shas["attn_comment_more"], "1", "--max-num-batched-tokens 256"} \
        <= set(names)  # fmt: skip
    run_dir = tmp_path / "run"
    t2 = time.monotonic()
    run = [sys.executable, "-m", "speedtrap", "run", "--manifest", str(manifest), "--out", str(run_dir), "--quick"]
    done = subprocess.run([*run, "--json"], capture_output=True, text=True, check=False)
    run_s = time.monotonic() - t2
    assert done.returncode == 0, done.stderr[-4000:]
    isolation = json.loads((run_dir / "report.json").read_text())["isolation"]
    culprits = [tuple(c["patches"]) for c in isolation["culprits"]]
    print(json.dumps({"init_s": round(init_s, 1), "run_s": round(run_s), "trials": len(isolation["trials"]),
                      "culprits": culprits}), flush=True)  # fmt: skip
    assert culprits == [(names[shas["mlp_scale"]],)], culprits
