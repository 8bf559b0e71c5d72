"""A real SGLang (0.5.23, CPU) beside the tests: its venv built once per machine, the model exported, servers.

The recipe is the one measured in ``../shared/sglang-cpu.md``: a venv; ``torch==2.13.0`` (the ``+cpu``
build); SGLang's declared requirements minus torch and the CUDA-only ones (``requirements-cpu.txt`` beside
this file, constrained to that torch); ``sglang==0.5.23`` with ``--no-deps``; ``sgl_kernel`` built from the
vendored CPU sources (``third_party/sgl-kernel-cpu``) with ``-march=native`` in place of the hard-coded
AVX-512/AMX flags; and torchvision's import made to work with the CPU torch (its fake-op registrations for
``nms``/``qnms`` only where its C ops loaded). The venv lives outside the clone (``tests/_stacks.py``), keyed
by this recipe and the CPU's flags, so every clone on the machine reuses it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _stacks import ensure_stack_dir, locked

if TYPE_CHECKING:
    from speedtrap.stack import Server


SGLANG_VERSION = "0.5.23"
TORCH_VERSION = "2.13.0"
TORCHVISION_VERSION = "0.28.0"  # torch 2.13's; PyPI's wheel is a CUDA build, hence fix_torchvision
KERNEL_RECIPE = "sgl-kernel-cpu 0.4.5 (modal-projects/sglang 8905cbd4)"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REQUIREMENTS = HERE / "requirements-cpu.txt"
MODEL = ROOT / ".sglang-model"


def _kernel_sources() -> Path:
    """The vendored sgl-kernel CPU sources: ``$SPEEDTRAP_SGL_KERNEL_SRC``, else ``shared/`` beside the clone (as
    CI lays it), else the developers' ``/work/shared``."""
    if "SPEEDTRAP_SGL_KERNEL_SRC" in os.environ:
        return Path(os.environ["SPEEDTRAP_SGL_KERNEL_SRC"])
    for shared in (ROOT.parent / "shared", Path("/work/shared")):
        if (shared / "third_party" / "sgl-kernel-cpu" / "CMakeLists.txt").exists():
            return shared / "third_party" / "sgl-kernel-cpu"
    fix = "set SPEEDTRAP_SGL_KERNEL_SRC to shared/third_party/sgl-kernel-cpu"
    raise RuntimeError(f"sgl-kernel's CPU sources not found (fix: {fix})")


# A made-up secret in the test server's environment: inspect must show the name and hide the value.
SECRET = ("HF_TOKEN", "hf_speedtrapRedactionCheck0123456789")
START_TIMEOUT = 900.0  # 80-85 s from launch to ready on 2 idle cores; the tests share them with other work
# torchvision's fake-op registrations for nms/qnms, made conditional on its C ops having loaded.
TORCHVISION_OLD = '@torch.library.register_fake("torchvision::{op}")\n'
TORCHVISION_NEW = (
    '@(torch.library.register_fake("torchvision::{op}") if torchvision.extension._has_ops() else (lambda f: f))\n'
)
# The build's steps, in order (part of the recipe: a change here builds a new stack).
STEPS = (
    "python -m venv; pip install torch=={torch}",
    "pip install -r requirements-cpu.txt -c torch=={torch}",
    "pip install --no-deps sglang=={sglang} torchvision",
    "pip install --no-deps <sgl-kernel-cpu wheel: its own stack, -march=native>",
    "torchvision _meta_registrations.py: {old} -> {new}",
    "python -c 'import torchvision.transforms, sgl_kernel, sglang.srt.server_args'",
)
# The flags of sgl-kernel's CMakeLists.txt that need AVX-512/AMX, replaced by the building CPU's own.
HARD_CODED_FLAGS = ("-march=x86-64-v4", "-mavx512bf16", "-mavx512vnni", "-mamx-tile", "-mamx-bf16", "-mamx-int8")


def _recipe() -> str:
    return "\n".join([
        f"sglang=={SGLANG_VERSION}", f"torch=={TORCH_VERSION}", REQUIREMENTS.read_text(),
        f"torchvision=={TORCHVISION_VERSION}", KERNEL_RECIPE, " ".join(HARD_CODED_FLAGS),
        *(step.format(torch=TORCH_VERSION, sglang=SGLANG_VERSION, old=TORCHVISION_OLD, new=TORCHVISION_NEW)
          for step in STEPS),
    ])  # fmt: skip


def _run(argv: list[str], log: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False, cwd=cwd, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"building the SGLang venv failed (exit {done.returncode}); see {log}")


def _pip(python: Path, *args: str, log: Path) -> None:
    _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", *args], log)


def native_cmake(text: str) -> str:
    """sgl-kernel's CMakeLists.txt with the x86_64 branch's AVX-512/AMX flags replaced by ``-march=native``."""
    missing = [flag for flag in HARD_CODED_FLAGS if flag not in text]
    if missing:
        raise RuntimeError(f"sgl-kernel's CMakeLists.txt changed: {missing} not found")
    for flag in HARD_CODED_FLAGS:
        text = text.replace(f"        {flag}\n", "        -march=native\n" if flag == "-march=x86-64-v4" else "")
    return text


def fix_torchvision(python: Path) -> None:
    """Register torchvision's fake ``nms``/``qnms`` ops only where its C ops loaded (the CUDA torchvision wheel
    pip picks, beside the CPU torch, otherwise fails ``import torchvision.transforms``)."""
    code = "import importlib.util as u; print(u.find_spec('torchvision').submodule_search_locations[0])"
    where = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    if where.returncode != 0:
        return  # no torchvision: nothing to fix
    meta = Path(where.stdout.strip()) / "_meta_registrations.py"
    text = meta.read_text()
    for op in ("nms", "qnms"):
        text = text.replace(TORCHVISION_OLD.format(op=op), TORCHVISION_NEW.format(op=op))
    meta.write_text(text)


def _ensure_libnuma(log: Path) -> None:
    """Debian's ``libnuma-dev`` (sgl-kernel's CPU build links libnuma), installed with apt-get if absent."""
    if Path("/usr/include/numa.h").exists():
        return
    if not shutil.which("apt-get"):
        raise RuntimeError("sgl-kernel's CPU build needs libnuma's headers (fix: install libnuma-dev)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-q"], log, env=env)
    _run(["apt-get", "install", "-y", "-q", "libnuma-dev"], log, env=env)


def _build_kernel(folder: Path, log: Path) -> None:
    """sgl_kernel's CPU wheel for this CPU, built in a venv of its own (torch and scikit-build-core only)."""
    _ensure_libnuma(log)
    venv = folder / "build-venv"
    _run([sys.executable, "-m", "venv", str(venv)], log)
    python = venv / "bin" / "python"
    _pip(python, f"torch=={TORCH_VERSION}", "scikit-build-core>=0.10", "wheel", log=log)
    with tempfile.TemporaryDirectory(prefix="sgl-kernel-") as tmp:
        src = Path(tmp) / "sgl-kernel-cpu"
        shutil.copytree(_kernel_sources(), src)
        shutil.copy(src / "pyproject_cpu.toml", src / "pyproject.toml")
        cmake = src / "csrc" / "cpu" / "CMakeLists.txt"
        cmake.chmod(0o644)
        cmake.write_text(native_cmake(cmake.read_text()))
        env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
        argv = ["nice", "-n", "10", str(python), "-m", "pip", "wheel", "--no-build-isolation", "--no-deps"]
        _run([*argv, "-w", str(folder / "wheels"), "."], log, cwd=src, env=env)
    shutil.rmtree(venv)


def ensure_kernel_wheel() -> Path:
    """sgl_kernel's CPU wheel, built once per machine (its own stack: a later step failing keeps it)."""
    recipe = "\n".join([f"torch=={TORCH_VERSION}", KERNEL_RECIPE, " ".join(HARD_CODED_FLAGS), "-march=native"])
    folder = ensure_stack_dir("sgl-kernel-cpu", recipe, _build_kernel)
    return next((folder / "wheels").glob("sglang_kernel_cpu-*.whl"))


def _build(folder: Path, log: Path) -> None:
    venv = folder / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], log)
    python = venv / "bin" / "python"
    _pip(python, f"torch=={TORCH_VERSION}", log=log)
    pin = folder / "constraints.txt"
    pin.write_text(f"torch=={TORCH_VERSION}\n")
    _pip(python, "-r", str(REQUIREMENTS), "-c", str(pin), log=log)
    _pip(python, "--no-deps", f"sglang=={SGLANG_VERSION}", f"torchvision=={TORCHVISION_VERSION}", log=log)
    _pip(python, "--no-deps", str(ensure_kernel_wheel()), log=log)
    fix_torchvision(python)
    _run([str(python), "-c", "import torchvision.transforms, sgl_kernel, sglang.srt.server_args"], log)


def ensure_python() -> Path:
    """The SGLang venv's python, built on first use (under a lock) and reused afterwards."""
    return ensure_stack_dir("sglang", _recipe(), _build) / "venv" / "bin" / "python"


def ensure_model(out: Path = MODEL) -> Path:
    """The dense SmolLM2 as an HF folder, exported once with ``speedtrap export`` (as a user would)."""
    with locked(out.parent / ".sglang-model.lock"):
        if not (out / "model.safetensors").exists():
            argv = [sys.executable, "-m", "speedtrap", "export", "--target", "smol-moe", "--format", "hf"]
            subprocess.run([*argv, "--out", str(out), "--force"], check=True, capture_output=True)
    return out


def ensure_stack() -> tuple[Path, Path]:
    """The SGLang venv's python and the exported model folder."""
    return ensure_python(), ensure_model()


def sglang_argv(python: Path, model: Path, port: int, *extra: str) -> list[str]:
    """The launch measured in ``sglang-cpu.md``: CPU, torch-native attention, float32, 4,096 KV tokens."""
    return [str(python), "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu",
            "--attention-backend", "torch_native", "--disable-overlap-schedule", "--dtype", "float32",
            "--max-total-tokens", "4096", "--max-running-requests", "4", "--host", "127.0.0.1",
            "--port", str(port), *extra]  # fmt: skip


def sglang_env(**switches: str) -> dict[str, str]:
    """This environment without any SGLang switch (nor our PYTHONPATH), plus the CPU engine and ``switches``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "SPEEDTRAP_SGLANG_", "PYTHONPATH"))}
    return {**env, "SGLANG_USE_CPU_ENGINE": "1", **switches}


def start_sglang(
    python: Path, model: Path, log: Path, *extra: str, source: Path | None = None, **switches: str
) -> Server:
    """An SGLang server started through isolate's launcher (own process group, stopped with its children);
    ``source``: a folder holding an ``sglang`` package that shadows the venv's (a worktree of the example)."""
    from speedtrap.stack import LaunchSpec, free_port, launch

    port = free_port()
    spec = LaunchSpec(
        tuple(sglang_argv(python, model, port, *extra)),
        sglang_env(**switches, **({"PYTHONPATH": str(source)} if source else {})),
        f"http://127.0.0.1:{port}/health",
        start_timeout=START_TIMEOUT,
        stop_timeout=30.0,
        cwd=source,
    )
    return launch(spec, log, port)


if __name__ == "__main__":
    os.environ.setdefault("PIP_NO_INPUT", "1")
    t0 = time.monotonic()
    python, model = (ensure_python(), None) if "--venv-only" in sys.argv else ensure_stack()
    print(f"SGLang venv: {python}; model: {model} ({time.monotonic() - t0:.0f} s)")
