"""``speedtrap export --format hf``: the dense model as a folder that transformers (and vLLM) load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from speedtrap.targets._base import InProcessModel
from speedtrap.targets.smolmoe.equivalence import MAX_ABS_LOGIT_DIFF_BOUND, check_equivalence


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    out = tmp_path_factory.mktemp("export") / "smollm2"
    argv = [sys.executable, "-m", "speedtrap", "export", "--target", "smol-moe", "--format", "hf", "--out", str(out)]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, check=True)
    return out, json.loads(done.stdout)


@pytest.mark.slow
def test_transformers_loads_the_export_and_matches_smol_moe(
    exported: tuple[Path, dict[str, object]], smol: InProcessModel
) -> None:
    """Ground truth from an implementation we did not write: transformers' LlamaForCausalLM on the folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, info = exported
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(info["files"])
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    result = check_equivalence(smol, model)
    assert result.equivalent, result
    assert result.max_abs_logit_diff <= MAX_ABS_LOGIT_DIFF_BOUND and result.tokens >= 1024
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    chat = [{"role": "user", "content": "Hi"}]
    rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == smol.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nHi<|im_end|>" in rendered  # SmolLM2's ChatML template came along


def test_export_refuses_a_folder_in_use_and_a_bad_format(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    expected = {"": "already exists and is not an empty folder", "gguf": "--format 'gguf' is not one of hf"}
    for fmt, message in expected.items():
        argv = [sys.executable, "-m", "speedtrap", "export", "--out", str(tmp_path)]
        done = subprocess.run([*argv, *(["--format", fmt] if fmt else [])], capture_output=True, text=True, check=False)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert (tmp_path / "mine.txt").read_text() == "keep me"
