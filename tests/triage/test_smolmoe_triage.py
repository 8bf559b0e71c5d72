"""Triage of smol-moe's eight real patch diffs: the tiers, the reasons, and the plan's content."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedtrap.cli import app
from speedtrap.triage import TriageReport, from_target, render_plan, triage


@pytest.fixture(scope="module")
def report() -> TriageReport:
    return triage(from_target("smol-moe", None), "routed_scaling_factor")


def test_tier_one_is_the_routed_scaling_and_mhc_bf16_patches(report: TriageReport) -> None:
    assert len(report.patches) == 8
    tier1 = {p.name for p in report.tier(1)}
    assert tier1 == {"hash_topk_routed_scaling", "mhc_bf16_gemm"}
    assert report.patches[0].name == "hash_topk_routed_scaling"
    for harmless in ("fused_rmsnorm", "moe_fused_experts", "chunked_prefill"):
        # Harmless by construction, but a new kernel is not proven equal on the AST: tier 2, not "same math".
        p = next(p for p in report.patches if p.name == harmless)
        assert p.tier == 2 and p.ranking.risk == 0
        assert p.ranking.reasons[0].startswith("no static signal: changes computation on the forward path")
        assert "no known risky pattern matched: model.py:" in p.ranking.in_full[0]
        assert not p.ranking.signal
    assert report.tier(3) == []


def test_tier_one_reasons_are_named(report: TriageReport) -> None:
    scaling = next(p for p in report.patches if p.name == "hash_topk_routed_scaling")
    reasons = "\n".join(scaling.ranking.in_full)
    assert "replaces the 'not implemented' guard `assert not apply_routed_scaling_factor_on_output" in reasons
    assert "adds a multiply by routed_scaling_factor in HashTopK.forward" in reasons
    assert "possible double application of routed_scaling_factor: MoE.forward" in reasons
    assert "some layers" in reasons and "layer_idx < config.num_hash_layers" in reasons
    assert "config-conditional (apply_routed_scaling_factor_on_output)" in reasons
    assert scaling.gate.kind == "config"

    mhc = next(p for p in report.patches if p.name == "mhc_bf16_gemm")
    reasons = "\n".join(mhc.ranking.in_full)
    assert "precision lowered to bf16 in HyperConnection.forward" in reasons
    assert "every layer" in reasons and "Block is built once per layer" in reasons
    assert mhc.signals.phases == "both" and mhc.gate.env == (("SPEEDTRAP_SMOLMOE_MHC_BF16_GEMM", "1"),)


def test_phase_guesses_match_what_the_patches_declare(report: TriageReport) -> None:
    for p in report.patches:
        declared = p.patch.declared["phases"]
        guessed = ["decode", "prefill"] if p.signals.phases == "both" else [p.signals.phases]
        assert guessed == declared, p.name


def test_the_plan_reads_like_an_engineers(report: TriageReport) -> None:
    plan = render_plan(report, ["--target", "smol-moe"])
    assert plan.startswith("# Triage plan")
    suspects = re.findall(r"^### \d+\. `(\w+)` \(Tier (\d)\)", plan, re.M)
    assert suspects[:2] == [("hash_topk_routed_scaling", "1"), ("mhc_bf16_gemm", "1")]
    section = plan.split("### 1.", 1)[1].split("### 2.", 1)[0]
    assert "Check first:" in section
    assert "Is `routed_scaling_factor` applied exactly once?" in section
    assert "`speedtrap triage --target smol-moe --symbol routed_scaling_factor`" in section
    assert "model.py:265" in section or "MoE.forward" in section
    assert "grep -n '\"apply_routed_scaling_factor_on_output\"' MODEL_DIR/config.json" in section
    assert "config edit + relaunch" in section
    mhc = plan.split("### 2.", 1)[1].split("### 3.", 1)[0]
    assert "drift from fp32" in mhc and "speedtrap check equivalence --target smol-moe --patches mhc_bf16_gemm" in mhc
    assert "switch (env var)" in mhc
    ab = plan.split("## A/B: by a switch, or only by a rebuild", 1)[1]
    assert "| `hash_topk_routed_scaling` | 1 |" in ab and "| `fused_rmsnorm` | 2 |" in ab
    order = plan.split("## Order of work", 1)[1]
    assert "no env var can switch off (`hash_topk_routed_scaling`)" in order
    assert "## Every site of `routed_scaling_factor`" in plan and "**Warning**: possible double application" in plan


def test_cli_json_and_plan_file(tmp_path: Path) -> None:
    plan = tmp_path / "plan.md"
    result = CliRunner().invoke(
        app, ["triage", "--target", "smol-moe", "--symbol", "routed_scaling_factor", "--plan", str(plan), "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data["tiers"]["1"]) == {"hash_topk_routed_scaling", "mhc_bf16_gemm"}
    assert data["trace"]["double_applications"][0]["other"]["function"] == "MoE.forward"
    assert data["plan_path"] == str(plan) and plan.read_text().startswith("# Triage plan")
