"""Build the SGLang example: SGLang 0.5.23's package as a git repository with speed patches as commits.

    python examples/sglang/build_example.py     # then: speedtrap run --manifest examples/sglang/speedtrap.toml
    python examples/sglang/build_example.py --tp 2   # the same stack at tensor parallelism 2

It makes (all ignored by git, rebuilt by this script):

- the SGLang venv (``tests/sglang/sglang_stack.py``: built once per machine, outside the clone);
- ``examples/sglang/.model/``: ``speedtrap export --target smol-moe --format glm4-moe`` (GLM-4.5's MoE layout,
  the function smol-moe computes), served by SGLang's own ``glm4_moe.py``;
- ``examples/sglang/.sglang-src/``: the ``sglang`` package exactly as the wheel installed it (compiled
  extensions linked, not copied), committed as the base, and on top of it the commits below;
- ``examples/sglang/speedtrap.toml``: the manifest naming those commits and SGLang's own launch flags as patches.

The commits (ground truth by construction):

- ``topk_comment``: a comment in ``layers/moe/topk.py`` (harmless);
- ``glm4_fused_topk_scale`` (THE SEED'S BUG): Glm4MoeSparseMoeBlock builds its ``TopK`` with
  ``apply_routed_scaling_factor_on_output=True`` (top-k multiplies its weights by ``routed_scaling_factor``)
  while ``forward_normal`` still multiplies the experts' output by it: the factor is applied twice;
- ``shared_experts_bf16``: the shared experts' output rounded through bfloat16 (a precision patch: small);
- ``topk_comment_more``: edits the line ``topk_comment`` wrote (harmless; applies only on top of it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REPO = HERE / ".sglang-src"
MODEL = HERE / ".model"
MANIFEST = HERE / "speedtrap.toml"
GLM4 = "sglang/srt/models/glm4_moe.py"
TOPK = "sglang/srt/layers/moe/topk.py"
_FUSE_OLD = """            apply_routed_scaling_factor_on_output=getattr(
                self.experts, "should_fuse_routed_scaling_factor_in_topk", False
            ),
"""
_SHARED_OLD = "            return self.shared_experts(hidden_states)\n"
# (name, file, old text, new text, commit message)
COMMITS = (
    ("topk_comment", TOPK, "def biased_grouped_topk_impl(\n",
     "# Grouped top-k with a correction bias (DeepSeek-V3 / GLM-4.5 routing).\ndef biased_grouped_topk_impl(\n",
     "topk: say which models route through the biased grouped top-k"),
    ("glm4_fused_topk_scale", GLM4, _FUSE_OLD,
     "            apply_routed_scaling_factor_on_output=True,  # fuse the scale into top-k: one pass less\n",
     "glm4_moe: fuse routed_scaling_factor into the top-k weights"),
    ("shared_experts_bf16", GLM4, _SHARED_OLD,
     "            return self.shared_experts(hidden_states).bfloat16().to(hidden_states.dtype)\n",
     "glm4_moe: shared experts' output kept in bfloat16 (halves its traffic)"),
    ("topk_comment_more", TOPK, "# Grouped top-k with a correction bias (DeepSeek-V3 / GLM-4.5 routing).\n",
     "# Grouped top-k with a correction bias (DeepSeek-V3 / GLM-4.5 routing; CPU: torch.compile).\n",
     "topk: say how it runs on CPUs"),
)  # fmt: skip
# SGLang's own speed flags, each a patch (argparse keeps the last of a repeated flag).
FLAGS = (
    ("chunked_prefill_64", ["--chunked-prefill-size", "64"], "chunked prefill: prompts prefilled 64 tokens a step"),
    ("radix_cache_off", ["--disable-radix-cache"], "no prefix (radix) cache"),
    ("bf16", ["--dtype", "bfloat16"], "weights and activations in bfloat16 instead of float32"),
)  # fmt: skip


def git(*args: str, repo: Path = REPO) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "speedtrap", "GIT_AUTHOR_EMAIL": "speedtrap@example.invalid",
           "GIT_COMMITTER_NAME": "speedtrap", "GIT_COMMITTER_EMAIL": "speedtrap@example.invalid"}  # fmt: skip
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)  # noqa: S603
    return done.stdout.strip()


def copy_package(src: Path, dst: Path) -> None:
    """The installed package as a source tree: Python and data files copied, compiled extensions linked."""
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


def build_repo(python: Path, repo: Path = REPO) -> dict[str, str]:
    """``repo`` anew: the installed sglang package as the base commit, then ``COMMITS``; name -> sha (and base)."""
    code = "import sglang, os; print(os.path.dirname(sglang.__file__))"
    site = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)  # noqa: S603
    site_dir = site.stdout.strip()
    shutil.rmtree(repo, ignore_errors=True)
    copy_package(Path(site_dir), repo / "sglang")
    git("init", "-q", "-b", "main", repo=repo)
    git("add", "-A", repo=repo)
    git("commit", "-q", "-m", "sglang 0.5.23 as installed from the wheel", repo=repo)
    shas = {"base": git("rev-parse", "HEAD", repo=repo)}
    for name, file, old, new, message in COMMITS:
        path = repo / file
        text = path.read_text()
        if text.count(old) != 1:
            raise RuntimeError(f"{name}: the text to edit is not in {file} exactly once")
        path.write_text(text.replace(old, new))
        git("commit", "-q", "-am", message, repo=repo)
        shas[name] = git("rev-parse", "HEAD", repo=repo)
    return shas


def export_model(out: Path = MODEL) -> Path:
    if not (out / "model.safetensors").exists():
        argv = [sys.executable, "-m", "speedtrap", "export", "--target", "smol-moe", "--format", "glm4-moe"]
        subprocess.run([*argv, "--out", str(out), "--force"], check=True, capture_output=True)  # noqa: S603
    return out


# Tensor parallelism 2 on a CPU without AMX (../shared/tp-cpu.md): SGLang asserts a thread binding per rank
# (without AMX it is not applied: the all-reduce falls back to gloo) and is 2x faster with one OMP thread.
TP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "OMP_NUM_THREADS": "1"}


def manifest_text(
    python: Path,
    model: Path,
    shas: dict[str, str],
    flags: bool = True,
    repeats: int = 0,
    repo: Path = REPO,
    tp: int = 1,
) -> str:
    """The example's manifest: the launch measured in ``sglang_stack.sglang_argv``, the commits, the flags;
    ``tp`` 2: the same at tensor parallelism 2 (``--tp 2`` and :data:`TP_ENV`)."""
    sys.path.insert(0, str(ROOT / "tests" / "sglang"))
    import sglang_stack

    launch = sglang_stack.sglang_argv(python, Path("{model}"), 0, *(("--tp", str(tp)) if tp > 1 else ()))
    launch[launch.index("--port") + 1] = "{port}"
    env = {"SGLANG_USE_CPU_ENGINE": "1", **(TP_ENV if tp > 1 else {})}
    lines = [
        "# speedtrap over a real SGLang 0.5.23 (CPU) serving smol-moe's function in GLM-4.5's MoE layout.",
        "# Written by examples/sglang/build_example.py (paths and commit shas are this machine's).",
        "",
        "[target]",
        f"launch = {json.dumps(launch)}",
        f"model = {json.dumps(str(model))}",
        f"repo = {json.dumps(str(repo))}",
        f"base = {json.dumps(shas['base'])}",
        "pythonpath = [\".\"]                 # the worktree's sglang/ shadows the venv's",
        'health = "http://127.0.0.1:{port}/health"',
        f"served_model = {json.dumps(str(model))}",
        f"start_timeout = {int(sglang_stack.START_TIMEOUT)}",
        "stop_timeout = 30",
        "retries = 0",
        "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
        "",
    ]
    for name, _, _, _, message in COMMITS:
        if name in shas:
            lines += [
                "[[patches]]",
                f'name = "{name}"',
                f'commit = "{shas[name]}"',
                f"summary = {json.dumps(message)}",
                "",
            ]
    for name, args, summary in FLAGS if flags else ():
        lines += [
            "[[patches]]",
            f'name = "{name}"',
            f"args = {json.dumps(args)}",
            f"summary = {json.dumps(summary)}",
            "",
        ]
    lines += [
        "[probe]",
        'kind = "divergence"',
        'preset = "quick"',
        'api = "sglang"                     # /generate with input_ids: logprobs keyed by token id',
        "",
        "[verdict]",
        'metric = "worst.kl_p99"',
        "bound = 0.05",
        f"repeats = {repeats}",
        "",
        "[search]",
        "prior = []",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "sglang"))
    import sglang_stack

    tp = int(sys.argv[sys.argv.index("--tp") + 1]) if "--tp" in sys.argv else 1  # --tp 2: the manifest at TP 2
    python = sglang_stack.ensure_python()
    model = export_model()
    shas = build_repo(python)
    MANIFEST.write_text(manifest_text(python, model, shas, tp=tp))
    print(f"wrote {REPO} ({len(shas) - 1} commits on {shas['base'][:10]}), {model}, {MANIFEST}")


if __name__ == "__main__":
    main()
