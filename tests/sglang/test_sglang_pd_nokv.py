"""A decode that received no KV, on the real SGLang PD stack: caught by ``check --against`` and said plainly.

A slow test (in CI: two PD launches, 141 s here). The construction: the PD example's SGLang repository with one
more commit, ``kv_send_skipped``, whose ``MooncakeKVManager.send_kvcache`` returns success at once (a "fast path"
that moves nothing), switched on the prefill (the sender) only. The decode then reads KV pages the prefill never
wrote; the prefill's own answers (the prompt's logprobs, the first token) are untouched. So by construction the
prompt agrees with the base and the decode is wrong from its first step read from the KV cache.

The base stack is recorded once (no patch on); ``speedtrap check --against REC --manifest F --config
kv_send_skipped`` launches the patched stack, judges it and stops it: exit 1, and the line that says where the
fault is. A watcher counts ``sglang.launch_server`` processes: at most one stack (two servers) alive.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sglang_pd_stack import example_module

from _watch import ServerWatcher, argv_has, descends_from
from speedtrap.isolate import ServerOracle
from speedtrap.manifest import load_manifest
from speedtrap.probe import DivergenceSettings, record

pd_example = example_module()  # examples/sglang-pd/build_example.py

NAME = "kv_send_skipped"
CONN = "sglang/srt/disaggregation/mooncake/conn.py"
SEND = (  # send_kvcache's first statement
    "        self._validate_envelope_kv_layout(\n"
    "            dst_kv_ptrs, dst_kv_item_len, dst_attn_tp_size\n"
    "        )\n"
)
SKIP = "        return 0  # fast path: the destination already holds these pages\n"


def _commit_skip(repo: Path) -> str:
    """The construction: one more commit on the example's history (after its own), in which ``send_kvcache``
    returns 0 (success) before sending anything; switched on alone, it applies to the base by itself."""
    git = pd_example.single.git
    path = repo / CONN
    text = path.read_text()
    assert text.count(SEND) == 1, "send_kvcache's first statement moved: update the construction"
    path.write_text(text.replace(SEND, SKIP + SEND))
    git("commit", "-q", "-am", "mooncake: skip re-sending KV pages the decode already holds", repo=repo)
    return git("rev-parse", "HEAD", repo=repo)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_transfer_that_moves_nothing_is_caught_and_read_as_the_decode_side(tmp_path: Path) -> None:
    example = pd_example.build(tmp_path / "example")
    manifest = load_manifest(example)
    assert manifest.target.repo is not None and manifest.target.base is not None
    sha = _commit_skip(Path(manifest.target.repo))
    path = tmp_path / "speedtrap.toml"
    table = f'\n[[patches]]\nname = "{NAME}"\ncommit = "{sha}"\nroles = ["prefill"]\n'
    path.write_text(example.read_text() + table)
    manifest = load_manifest(path)
    settings = dataclasses.replace(DivergenceSettings.quick(), **manifest.probe.settings)
    with ServerWatcher(argv_has(b"sglang.launch_server"), descends_from(os.getpid())) as watcher:
        t0 = time.monotonic()
        oracle = ServerOracle(manifest.target, manifest.patches, manifest.probe)
        stack, launch_s = oracle.start((), tmp_path / "base.log")
        with stack:
            rec = record(oracle.backend(stack), tmp_path / "base.strec", divergence=settings, progress=False)
        base_s = time.monotonic() - t0
        argv = [sys.executable, "-m", "speedtrap", "check", "--against", str(rec.path), "--manifest", str(path),
                "--config", NAME, "--run-dir", str(tmp_path / "check")]  # fmt: skip
        t1 = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
        check_s = time.monotonic() - t1
    out = done.stdout
    print(f"base launch {launch_s:.0f} s, recorded in {base_s:.0f} s; check {check_s:.0f} s, exit {done.returncode}")
    print(out)
    assert done.returncode == 1, out[-3000:] + done.stderr[-3000:]
    assert "FAIL divergence" in out
    reading = next((line for line in out.splitlines() if line.startswith("reading: ")), None)
    assert reading is not None, out
    assert "decode step 1" in reading and "did not receive the prefill's KV" in reading, reading
    assert watcher.most <= 2, f"{watcher.most} SGLang servers alive at once (a stack is two)"
    print(json.dumps({"launch_s": round(launch_s), "base_s": round(base_s), "check_s": round(check_s),
                      "most_servers": watcher.most}))  # fmt: skip
