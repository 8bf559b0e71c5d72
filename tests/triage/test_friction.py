"""Friction met by a new user: several diffs after one --patch, long paths at 80 columns, gate labels
from conditions that do not select the change, init while the checkout is at the range's base, and a
plan that names a tree that is gone or a switch an ungated patch does not have."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedtrap.cli import app
from speedtrap.triage import from_diff_files, from_git_range, render_plan, triage

DEEP = "pkg/model_executor/layers/fused_moe/very_long_module_name_for_a_kernel.py"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "m.py").write_text(
        textwrap.dedent(
            """\
            import os


            def f(x, config, scale):
                if config.hidden_act != "silu":
                    raise ValueError("silu only")
                if os.environ.get("FAST") == "1":
                    return x
                else:
                    y = x * 1.0
                return y
            """
        )
    )
    (root / DEEP).parent.mkdir(parents=True)
    (root / DEEP).write_text("def kernel(x, routed_scaling_factor):\n    return x * routed_scaling_factor\n")
    _git(root, "init", "-q")
    _git(root, "-c", "user.email=a@b", "-c", "user.name=a", "add", ".")
    _git(root, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "base")
    _git(root, "tag", "base")
    text = (root / "pkg" / "m.py").read_text().replace("y = x * 1.0", "y = x * scale")
    (root / "pkg" / "m.py").write_text(text)
    _git(root, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qam", "scale in the slow path")
    _git(root, "tag", "head")
    return root


def test_patch_takes_several_files(repo: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.diff", tmp_path / "b.diff"
    a.write_text(_git(repo, "diff", "base", "head"))
    b.write_text(_git(repo, "diff", "head", "base"))
    _git(repo, "checkout", "-q", "base")
    result = CliRunner().invoke(app, ["triage", "--patch", str(a), str(b), "--tree", str(repo), "--json"])
    assert result.exit_code == 0, result.output
    assert '"a"' in result.output and '"b"' in result.output
    stray = CliRunner().invoke(app, ["triage", str(a), "--tree", str(repo)])
    assert stray.exit_code == 2 and "unexpected argument" in stray.output


def test_site_table_at_80_columns_keeps_paths_whole(repo: Path) -> None:
    result = CliRunner().invoke(
        app, ["triage", "--tree", str(repo), "--symbol", "routed_scaling_factor"], env={"COLUMNS": "80"}
    )
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    first = "".join(line.split("│")[1].strip() for line in result.output.splitlines() if line.count("│") > 2)
    assert DEEP + ":2" in first


def test_gate_is_not_read_from_conditions_that_do_not_select_the_change(repo: Path) -> None:
    # The change sits after a validation raise on config.hidden_act and in the else branch of FAST=1:
    # neither switch turns it on, so the patch is ungated.
    _git(repo, "checkout", "-q", "base")
    report = triage(from_git_range(repo, "base..head", None))
    [p] = report.patches
    assert p.signals.detected_gate == ("ungated", ""), p.signals.detected_gate
    assert p.gate.kind == "ungated"


def test_plan_names_no_temporary_tree_and_no_switch_for_an_ungated_patch(repo: Path) -> None:
    patch_set = from_git_range(repo, "base..head", None)
    exported = str(patch_set.tree)
    try:
        report = triage(patch_set)
        plan = render_plan(report, patch_set.cli_args)
    finally:
        patch_set.close()
    assert exported not in plan and "temporary export, removed after the run" in plan
    assert "A/B by the switch above" not in plan


def test_init_at_the_ranges_base(repo: Path) -> None:
    _git(repo, "checkout", "-q", "base")
    out = repo.parent / "speedtrap.toml"
    result = CliRunner().invoke(app, ["init", "--range", "base..head", "--repo", str(repo), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("# NOTE: check out head") and 'summary = "scale in the slow path"' in text


def test_precision_plan_line_for_a_gated_patch_keeps_the_switch(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "m.py").write_text(
        "import os\n\n\ndef f(x):\n    if os.environ.get('BF16') == '1':\n        return x\n    return x\n"
    )
    diff = tmp_path / "p.diff"
    diff.write_text(
        "--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -4,4 +4,4 @@\n def f(x):\n     if os.environ.get('BF16') == '1':\n"
        "-        return x\n+        return x.bfloat16()\n     return x\n"
    )
    plan = render_plan(triage(from_diff_files([diff], tree)))
    assert "A/B by the switch above (relaunch without `BF16=1`)" in plan
