"""SGLang 0.5.23 prefill/decode-disaggregated beside the tests: the extra packages, and its launch recipe.

The recipe is the one measured in ``../shared/sglang-pd-cpu.md``, written here once and used by the tests,
the example (``examples/sglang-pd/build_example.py``) and the benchmark:

- the SGLang venv of ``sglang_stack.py`` left untouched; the two extra packages at pinned versions installed
  ``--no-deps`` into a folder of their own (put on ``PYTHONPATH``), built once per machine outside the clone
  (``tests/_stacks.py``), keyed by this recipe; Debian's ``libibverbs1`` (Mooncake's ``engine.so`` links it,
  no RDMA device needed) installed with apt-get if absent;
- three roles: the prefill and the decode (each pinned to its own core with ``taskset``), the KV moved over
  Mooncake's TCP transport (``--disaggregation-transfer-backend mooncake_tcp``), and ``sglang_router`` in PD
  mode (``--pd-disaggregation``) in front of them; the router's health is ``/readiness`` (its ``/health`` says
  200 before any worker is registered), and speedtrap's first real request through the router makes the
  stack ready;
- the two CPU-only traps and their fixes: ``SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER=1`` on the prefill (else
  it answers ``/health`` and dies on its first request: ``pin_memory=True requires a CUDA ...``) and
  ``--disaggregation-decode-retraction-backup cpu_tensor`` on the decode (else it dies at start).

Ports: one HTTP port per role (``{port}``), a ``--nccl-port`` per server (``{port.nccl}``), the bootstrap
port (``{prefill.port.bootstrap}``, the prefill's, repeated in the router's ``--prefill URL PORT``) and the
router's Prometheus port (``{port.metrics}``: its default, 29000 on every interface, is one port for every
launch and was found in use by the next stack's router).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_stack import START_TIMEOUT, _run, ensure_python, sglang_argv

from _stacks import ensure_stack_dir

PACKAGES = ("mooncake-transfer-engine-non-cuda==0.3.13.post1", "sglang-router==0.3.2")
LIBIBVERBS = Path("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")
# The settings every model role must share (a one-sided change is a conflict, not a trial).
AGREE = ("--disaggregation-transfer-backend", "--page-size", "--dtype", "--kv-cache-dtype")
TRANSFER = "mooncake_tcp"
CP_SWITCH = ("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER", "1")  # the prefill's CPU-only fix
RETRACTION = ("--disaggregation-decode-retraction-backup", "cpu_tensor")  # the decode's CPU-only fix
ROUTER_HEALTH = "http://127.0.0.1:{port}/readiness"
STEPS = (
    "apt-get install libibverbs1 (if {lib} is absent)",
    "pip install --no-deps --only-binary=:all: --target site {packages}",
    "python -c 'import mooncake.engine, sglang_router' with PYTHONPATH=site",
)


def _recipe() -> str:
    return "\n".join(
        [*PACKAGES, *(s.format(lib=LIBIBVERBS, packages=" ".join(PACKAGES)) for s in STEPS), "python3.11 venv pip"]
    )


def _ensure_libibverbs(log: Path) -> None:
    """Debian's ``libibverbs1`` (with libnl), installed with apt-get if absent."""
    if LIBIBVERBS.exists():
        return
    if not shutil.which("apt-get"):
        raise RuntimeError(f"Mooncake's engine.so needs {LIBIBVERBS.name} (fix: install libibverbs1)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-q"], log, env=env)
    _run(["apt-get", "install", "-y", "-q", "libibverbs1"], log, env=env)


def _build(folder: Path, log: Path) -> None:
    _ensure_libibverbs(log)
    python = ensure_python()
    site = folder / "site"
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:"]
    _run([*pip, "--target", str(site), *PACKAGES], log)
    check = "import mooncake.engine, sglang_router.launch_router"
    _run([str(python), "-c", check], log, env={**os.environ, "PYTHONPATH": str(site)})


def ensure_packages() -> Path:
    """The folder holding the two extra packages (put it on the roles' ``PYTHONPATH``), built on first use."""
    _ensure_libibverbs(Path(os.devnull))  # a machine where the folder was built may have lost the library
    return ensure_stack_dir("sglang-pd", _recipe(), _build) / "site"


def pd_tables(
    python: Path,
    site: Path,
    *,
    decode_transfer: str = TRANSFER,
    cp_switch: bool = True,
    cores: tuple[str, str] = ("0", "1"),
) -> dict[str, Any]:
    """``[target]`` (without model, repo, patches) and ``target.roles``: the PD stack as a manifest writes it.

    ``decode_transfer``: the decode's transfer backend (``fake`` moves no KV: the negative control);
    ``cp_switch``: False leaves out the prefill's CPU-only fix (it then dies on its first request).
    """
    if not os.sched_getaffinity(0) >= {int(c) for c in cores}:
        cores = ("0", "0")  # a one-core machine: both on the one core (slower, still disaggregated)

    def server(core: str, mode: str, transfer: str, *extra: str) -> list[str]:
        argv = sglang_argv(python, Path("{model}"), 0, "--disaggregation-mode", mode, "--nccl-port", "{port.nccl}")
        argv[argv.index("--port") + 1] = "{port}"
        argv += ["--disaggregation-transfer-backend", transfer]
        argv += ["--disaggregation-bootstrap-port", "{prefill.port.bootstrap}", *extra]
        return ["taskset", "-c", core, *argv]

    prefill_env = {CP_SWITCH[0]: CP_SWITCH[1]} if cp_switch else {}
    router = [str(python), "-m", "sglang_router.launch_router", "--pd-disaggregation",
              "--prefill", "http://127.0.0.1:{prefill.port}", "{prefill.port.bootstrap}",
              "--decode", "http://127.0.0.1:{decode.port}", "--host", "127.0.0.1", "--port", "{port}",
              # its Prometheus exporter binds 29000 on every interface by default: the next stack's router
              # found it in use ("Address already in use") while the last one's was still going away
              "--prometheus-host", "127.0.0.1", "--prometheus-port", "{port.metrics}"]  # fmt: skip
    return {
        "target": {
            "start_timeout": int(START_TIMEOUT),
            "stop_timeout": 30,
            "env": {
                "PYTHONPATH": str(site),
                "SGLANG_USE_CPU_ENGINE": "1",
                "SGLANG_HOST_IP": "127.0.0.1",
                "MC_TCP_BIND_ADDRESS": "127.0.0.1",
                "OMP_NUM_THREADS": "1",
            },
            # the fake control differs on purpose: the agreement check would refuse it before any launch
            "agree": [k for k in AGREE if decode_transfer == TRANSFER or k != "--disaggregation-transfer-backend"],
        },
        "target.roles.prefill": {
            "launch": server(cores[0], "prefill", TRANSFER),
            "ports": ["nccl", "bootstrap"],
            # the router merges the prefill's input_token_logprobs but drops its input_top_logprobs: the probe
            # asks the prompt's logprobs of the prefill directly (with SGLang's fake bootstrap host)
            "prompt_logprobs": True,
            **({"env": prefill_env} if prefill_env else {}),
        },
        "target.roles.decode": {
            "launch": server(cores[1], "decode", decode_transfer, *RETRACTION),
            "ports": ["nccl"],
        },
        "target.roles.router": {
            "launch": router,
            "health": ROUTER_HEALTH,
            "ports": ["metrics"],
            "after": ["prefill", "decode"],
            "entry": True,
            "runs_model": False,
        },
    }


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def tables_text(tables: dict[str, dict[str, Any]]) -> str:
    """TOML text of ``pd_tables``' tables (values are strings, numbers, booleans, lists and flat tables)."""
    lines: list[str] = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in table.items()]
        lines.append("")
    return "\n".join(lines)


def run_router_request(url: str, ids: list[int], tokens: int, timeout: float = 600.0) -> dict[str, Any]:
    """One greedy ``/generate`` by token ids (the answer's JSON)."""
    import httpx

    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": tokens, "temperature": 0.0}}
    with httpx.Client(timeout=timeout, trust_env=False) as client:
        response = client.post(f"{url}/generate", json=body)
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


if __name__ == "__main__":
    os.environ.setdefault("PIP_NO_INPUT", "1")
    print(ensure_packages())


def example_module() -> ModuleType:
    """``examples/sglang-pd/build_example.py``, loaded by path under a name of its own: every example's script is
    called ``build_example``, and a test worker that imported another one first would hand that one back."""
    path = Path(__file__).resolve().parents[2] / "examples" / "sglang-pd" / "build_example.py"
    spec = importlib.util.spec_from_file_location("sglang_pd_build_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
