"""smol-moe: equivalence with the dense model, its patches, its weight cache and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from speedtrap._errors import PatchError, TargetError, UsageError
from speedtrap.patching import GateKind, Phase
from speedtrap.targets._base import InProcessModel
from speedtrap.targets.smolmoe import SOURCE_DIR, SmolMoEConfig, build_patches, dense_weights, load_dense
from speedtrap.targets.smolmoe.equivalence import (
    MAX_ABS_LOGIT_DIFF_BOUND,
    EquivalenceResult,
    check_equivalence,
    dense_reference,
)


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return dense_reference(dense_weights())


@pytest.fixture(scope="module")
def baseline_equivalence(smol: InProcessModel, reference: torch.nn.Module) -> EquivalenceResult:
    return check_equivalence(smol, reference)


def test_smol_moe_equals_the_dense_model(baseline_equivalence: EquivalenceResult) -> None:
    result = baseline_equivalence
    assert result.tokens >= 1000
    assert result.top1_agreement >= 0.999
    assert result.max_abs_logit_diff <= MAX_ABS_LOGIT_DIFF_BOUND
    assert result.equivalent


def test_double_application_diverges_from_the_dense_model(
    smol: InProcessModel, reference: torch.nn.Module, baseline_equivalence: EquivalenceResult
) -> None:
    result = check_equivalence(smol, reference, ["hash_topk_routed_scaling"])
    assert not result.equivalent
    assert result.max_abs_logit_diff > 1000 * baseline_equivalence.max_abs_logit_diff
    assert result.top1_agreement < 0.9


def test_structure_is_deepseek_v4_shaped(smol: InProcessModel) -> None:
    from speedtrap.targets.smolmoe.model import HashTopK, SmolMoE, TopKRouter

    model = smol.model
    assert isinstance(model, SmolMoE)
    cfg = model.config
    kinds = [type(block.mlp.gate) for block in model.layers]
    assert kinds[: cfg.num_hash_layers] == [HashTopK] * cfg.num_hash_layers
    assert all(k is TopKRouter for k in kinds[cfg.num_hash_layers :])
    # The hyper-connection GEMM does real work: non-zero weights feed pre and comb.
    proj = model.layers[0].attn_hc.proj.weight
    n = cfg.hc_mult
    assert proj[:n].abs().sum() > 0 and proj[2 * n :].abs().sum() > 0
    # Routed experts share one weight set: no per-expert copies.
    assert sum(p.numel() for p in model.parameters()) < 1.1 * sum(t.numel() for t in dense_weights().state.values())


def test_the_hc_weights_are_data_dependent(smol: InProcessModel) -> None:
    hc = smol.model.layers[3].attn_hc
    streams = torch.randn(1, 5, smol.model.config.hc_mult, smol.model.config.hidden_size)
    post, comb, _ = hc(streams)
    assert torch.allclose(post, torch.ones_like(post))
    assert comb[0, 0].sub(comb[0, 1]).abs().max() > 1e-4
    assert torch.allclose(comb.sum(-2), torch.ones_like(comb.sum(-2)), atol=1e-5)


def test_eight_patches_with_full_facts() -> None:
    patches = build_patches()
    assert len(patches) == 8
    names = [p.info.name for p in patches]
    assert len(set(names)) == 8
    for p in patches:
        assert p.info.diff.startswith("--- a/model.py")
        assert p.info.phases
        assert p.info.layers or p.info.scope == "lm_head (after the last layer)"
    by = {p.info.name: p.info for p in patches}
    assert by["hash_topk_routed_scaling"].gate.kind is GateKind.CONFIG
    assert by["hash_topk_routed_scaling"].layers == tuple(range(SmolMoEConfig().num_hash_layers)) == tuple(range(6))
    assert 'assert not apply_routed_scaling_factor_on_output, "not implemented"' in by["hash_topk_routed_scaling"].diff
    assert by["mhc_bf16_gemm"].layers == tuple(range(30))
    assert by["mhc_bf16_gemm"].phases == {Phase.PREFILL, Phase.DECODE}
    assert by["fp8_kv_cache"].phases == {Phase.DECODE}
    assert by["fp8_kv_cache"].gate.key == "SPEEDTRAP_SMOLMOE_FP8_KV_CACHE"


def test_every_diff_applies_to_the_source_tree(tmp_path: Path) -> None:
    for patch in build_patches():
        work = tmp_path / patch.info.name
        work.mkdir()
        (work / "model.py").write_text((SOURCE_DIR / "model.py").read_text())
        done = subprocess.run(
            ["patch", "-p1", "--dry-run", "-d", str(work)], input=patch.info.diff, text=True, capture_output=True
        )
        assert done.returncode == 0, (patch.info.name, done.stdout, done.stderr)


def test_patches_swap_modules_and_undo_restores_them(smol: InProcessModel) -> None:
    before = {name: id(mod) for name, mod in smol.model.named_modules()}
    for patch in smol.catalog:
        with smol.patched([patch.info.name]):
            after = {name: id(mod) for name, mod in smol.model.named_modules()}
            changed = before != after or patch.info.name == "combine_without_routed_scaling"
            assert changed, f"{patch.info.name} swapped nothing"
        assert {name: id(mod) for name, mod in smol.model.named_modules()} == before


def test_harmless_kernel_patches_stay_equivalent(smol: InProcessModel, reference: torch.nn.Module) -> None:
    for name in ("fused_rmsnorm", "moe_fused_experts"):
        assert check_equivalence(smol, reference, [name], min_tokens=256).equivalent, name


def test_fp8_kv_cache_changes_decode_not_prefill(smol: InProcessModel) -> None:
    ids = smol.chat_ids([{"role": "user", "content": "Tell me about lighthouses and the sea."}])
    split = len(ids) - 8

    def decode_logits() -> torch.Tensor:
        cache = smol.new_cache()
        smol.logits(ids[:split], cache)
        return torch.cat([smol.logits([t], cache) for t in ids[split:]])

    plain_prefill, plain_decode = smol.logits(ids), decode_logits()
    with smol.patched(["fp8_kv_cache"]):
        fp8_prefill, fp8_decode = smol.logits(ids), decode_logits()
    assert torch.equal(plain_prefill, fp8_prefill)
    assert (plain_decode - fp8_decode).abs().max() > 1e-2
    assert torch.allclose(plain_decode, plain_prefill[split:], atol=1e-3)


def test_unknown_patch_is_a_one_line_error(smol: InProcessModel) -> None:
    with pytest.raises(PatchError, match=r"unknown patch 'nope'.*choose from"):
        smol.set_patches(["nope"])
    assert smol.active == ()


def test_unknown_config_key_is_a_usage_error() -> None:
    from speedtrap.targets.smolmoe import SmolMoEConfig

    with pytest.raises(UsageError, match="no config key 'bogus'"):
        SmolMoEConfig().with_overrides({"bogus": "1"})
    with pytest.raises(UsageError, match="is not a float"):
        SmolMoEConfig().with_overrides({"routed_scaling_factor": "abc"})


def test_corrupt_cache_is_rebuilt_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from speedtrap._cache import cache_root

    good = dense_weights()
    entry = next(p for p in (cache_root() / "smol-moe").iterdir() if p.name.startswith(good.source_sha256[:16]))
    monkeypatch.setenv("SPEEDTRAP_CACHE_DIR", str(tmp_path))
    shutil.copytree(entry, tmp_path / "smol-moe" / entry.name)
    assert load_dense(good.source).from_cache  # an intact copy is used as it is
    weights = tmp_path / "smol-moe" / entry.name / "dense.safetensors"
    with weights.open("r+b") as f:  # flip bytes in the middle of the tensor data
        f.seek(weights.stat().st_size // 2)
        f.write(b"\x00\x01\x02\x03" * 4)
    rebuilt = load_dense(good.source)
    assert not rebuilt.from_cache
    again = load_dense(good.source)
    assert again.from_cache
    key = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(again.state[key], good.state[key])


def test_missing_or_corrupt_gguf_is_a_target_error(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="GGUF file not found"):
        load_dense(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(TargetError, match="cannot read GGUF file"):
        load_dense(bad)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "speedtrap", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_cli_patches_json_lists_eight() -> None:
    done = _cli("patches", "--target", "smol-moe", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)["patches"]
    assert len(listed) == 8
    for p in listed:
        assert p["gate"]["kind"] and p["kind"] and p["phases"] and p["diff"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("patches", "--target", "nope"), "unknown target 'nope'"),
        (("check", "equivalence", "--patches", "nope", "--json"), "unknown patch 'nope'"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args: tuple[str, ...], expected: str) -> None:
    done = _cli(*args)
    assert done.returncode == 2
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_cli_missing_gguf_is_one_line_exit_2(tmp_path: Path) -> None:
    import os

    env = dict(os.environ, SPEEDTRAP_SMOLLM2_GGUF=str(tmp_path / "gone.gguf"), SPEEDTRAP_CACHE_DIR=str(tmp_path))
    done = _cli("check", "equivalence", "--json", env=env)
    assert done.returncode == 2
    assert "GGUF file not found" in done.stderr and "Traceback" not in done.stderr
