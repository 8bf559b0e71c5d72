"""Real serving trees for triage tests: a wheel from PyPI (``pip download --no-deps``), its Python and
text files unpacked (no install, compiled extensions left out) into a temporary directory once per run.
``SPEEDTRAP_SGLANG_WHEEL`` / ``SPEEDTRAP_VLLM_WHEEL`` name a local copy instead; a registry that cannot
be reached skips the tests that need the tree, saying why."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SGLANG_VERSION = "0.5.23"
VLLM_VERSION = "0.33.0"


def wheel_tree(package: str, version: str, env: str, dest: Path, probe: str) -> Path:
    local = os.environ.get(env)
    if local:
        wheel = Path(local)
    else:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            "--retries",
            "1",
            "--timeout",
            "30",
            f"{package}=={version}",
            "-d",
            str(dest),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        except subprocess.TimeoutExpired:
            pytest.skip(f"pip download of {package} timed out (no registry access?)")
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            pytest.skip(f"pip cannot download {package}=={version} from the registry: {last}")
        wheel = next(dest.glob(f"{package}-*.whl"))
    tree = dest / "tree"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tree, [m for m in zf.namelist() if not m.endswith(".so")])
    assert (tree / probe).is_file(), f"{probe} is not in {wheel.name}"
    return tree


@pytest.fixture(scope="session")
def vllm_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheel_tree(
        "vllm",
        VLLM_VERSION,
        "SPEEDTRAP_VLLM_WHEEL",
        tmp_path_factory.mktemp("vllm"),
        "vllm/model_executor/layers/fused_moe/layer.py",
    )


@pytest.fixture(scope="session")
def sglang_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheel_tree(
        "sglang",
        SGLANG_VERSION,
        "SPEEDTRAP_SGLANG_WHEEL",
        tmp_path_factory.mktemp("sglang"),
        "sglang/srt/layers/moe/hash_topk.py",
    )
