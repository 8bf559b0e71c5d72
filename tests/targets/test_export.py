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
    expected = {"": "already exists and is not an empty folder", "gguf": "--format 'gguf' is not one of hf, glm4-moe"}
    for fmt, message in expected.items():
        argv = [sys.executable, "-m", "speedtrap", "export", "--out", str(tmp_path)]
        done = subprocess.run([*argv, *(["--format", fmt] if fmt else [])], capture_output=True, text=True, check=False)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert (tmp_path / "mine.txt").read_text() == "keep me"


@pytest.mark.slow
def test_the_glm4_moe_export_computes_the_dense_function(
    exported: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    """transformers' own Glm4MoeForCausalLM on the MoE export against its LlamaForCausalLM on the dense one; and
    the seed's bug built by hand on the export (the routed part's factor applied twice) is not the same function."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "glm4"
    argv = [sys.executable, "-m", "speedtrap", "export", "--format", "glm4-moe", "--out", str(out), "--json"]
    info = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    assert info["format"] == "glm4-moe"
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Glm4MoeForCausalLM"] and config["first_k_dense_replace"] == 24
    assert config["moe_intermediate_size"] * (config["n_shared_experts"] + 1) >= config["intermediate_size"]
    ids = torch.randint(0, 49152, (1, 96), generator=torch.Generator().manual_seed(0))
    dense = AutoModelForCausalLM.from_pretrained(str(exported[0]), dtype=torch.float32).eval()
    with torch.no_grad():
        want = dense(ids).logits
        moe = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
        assert type(moe.model.layers[29].mlp).__name__ == "Glm4MoeMoE"
        got = moe(ids).logits
        assert (got - want).abs().max().item() < 1e-3
        assert (got.argmax(-1) == want.argmax(-1)).all()
        state = load_file(str(out / "model.safetensors"))
        for key in [k for k in state if ".mlp.experts." in k and k.endswith("down_proj.weight")]:
            state[key] = state[key] * config["routed_scaling_factor"]  # the factor applied a second time
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        bugged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()(ids).logits
    assert (bugged - want).abs().max().item() > 1.0
