"""Triage on the real SGLang 0.5.23 source: the wheel is downloaded from PyPI into a temporary
directory (never committed). Set SPEEDTRAP_SGLANG_WHEEL=/path/to/sglang-0.5.23-*.whl to use a local copy."""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedtrap.cli import app
from speedtrap.triage import from_diff_files, trace_symbol, triage

SGLANG_VERSION = "0.5.23"
HASH_TOPK = "sglang/srt/layers/moe/hash_topk.py"
DEEPSEEK = "sglang/srt/models/deepseek_v2.py"
GUARDED = (
    "        if self.apply_routed_scaling_factor_on_output:\n"
    "            topk_weights = topk_weights * self.routed_scaling_factor\n"
)
UNCONDITIONAL = "        topk_weights = topk_weights * self.routed_scaling_factor\n"

pytestmark = pytest.mark.slow


def fetch_wheel(dest: Path) -> Path:
    local = os.environ.get("SPEEDTRAP_SGLANG_WHEEL")
    if local:
        return Path(local)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "--retries",
        "1",
        "--timeout",
        "30",
        f"sglang=={SGLANG_VERSION}",
        "-d",
        str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip("pip download of sglang timed out (no registry access?)")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"pip cannot download sglang=={SGLANG_VERSION} from the registry: {last}")
    return next(dest.glob("sglang-*.whl"))


@pytest.fixture(scope="module")
def sglang_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("sglang")
    wheel = fetch_wheel(dest)
    tree = dest / "tree"
    with zipfile.ZipFile(wheel) as zf:
        # Everything but compiled extensions (the tree triage reads; .so files are skipped anyway).
        zf.extractall(tree, [m for m in zf.namelist() if not m.endswith(".so")])
    assert (tree / HASH_TOPK).is_file(), f"{HASH_TOPK} is not in {wheel.name}"
    return tree


@pytest.fixture(scope="module")
def unconditional_diff(sglang_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A diff, as a patch author would write it, that makes HashTopK scale its output unconditionally."""
    before = (sglang_tree / HASH_TOPK).read_text()
    assert before.count(GUARDED) == 1, "SGLang's HashTopK no longer has the guarded multiply"
    after = before.replace(GUARDED, UNCONDITIONAL)
    text = "".join(
        difflib.unified_diff(
            before.splitlines(True), after.splitlines(True), f"a/python/{HASH_TOPK}", f"b/python/{HASH_TOPK}"
        )
    )
    path = tmp_path_factory.mktemp("diff") / "hash_topk_always_scale.diff"
    path.write_text(f"diff --git a/python/{HASH_TOPK} b/python/{HASH_TOPK}\n" + text)
    return path


def test_symbol_lists_the_sites_with_their_guarding_flags(sglang_tree: Path) -> None:
    result = trace_symbol(sglang_tree, "routed_scaling_factor")
    hash_sites = [s for s in result.sites if s.file == HASH_TOPK]
    [mul] = [s for s in hash_sites if s.role == "multiply"]
    assert mul.function == "HashTopK.forward" and mul.flags == ("apply_routed_scaling_factor_on_output",)
    assert any(s.role == "divide" and s.function == "HashTopK._forward_torch" for s in hash_sites)
    assert any(s.role == "configure" and s.function == "HashTopK.__init__" for s in hash_sites)

    model = [s for s in result.sites if s.file == DEEPSEEK and s.role == "multiply"]
    moe = [s for s in model if s.function.startswith("DeepseekV2MoE.forward")]
    assert moe and all("routed_scaling_factor_fused_in_topk" in s.flags for s in moe)
    assert all("final_hidden_states *= self.routed_scaling_factor" in s.code for s in moe)
    helper = [s for s in model if s.function == "_scale_routed_and_add_shared"]
    assert helper and all("fused_in_topk" in s.flags for s in helper)
    assert result.files_scanned > 4000


def test_unconditional_hash_topk_scaling_is_a_possible_double_application(
    sglang_tree: Path, unconditional_diff: Path
) -> None:
    report = triage(from_diff_files([unconditional_diff], sglang_tree), "routed_scaling_factor")
    assert report.elapsed_s <= 10.0, f"triage of the SGLang tree took {report.elapsed_s:.1f} s"
    assert report.trace is not None
    [added] = report.trace.added
    assert (added.file, added.function, added.guards) == (HASH_TOPK, "HashTopK.forward", ())
    others = {(d.other.file, d.other.function) for d in report.trace.double_applications}
    assert (DEEPSEEK, "DeepseekV2MoE.forward_normal") in others
    first = report.trace.double_applications[0]
    assert first.other.file == DEEPSEEK and first.other.function.startswith("DeepseekV2MoE.")
    [patch] = report.patches
    assert patch.tier == 1
    scale = next(s for s in patch.signals.signals if s.kind == "scale")
    assert "was if self.apply_routed_scaling_factor_on_output, now unconditional" in scale.summary
    assert patch.signals.best_hot_path is not None and patch.signals.best_hot_path.level in (
        "every layer",
        "some layers",
    )


def test_cli_json_on_the_sglang_tree(sglang_tree: Path, unconditional_diff: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "triage",
            "--patch",
            str(unconditional_diff),
            "--tree",
            str(sglang_tree),
            "--symbol",
            "routed_scaling_factor",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    messages = ["\n".join([d["message"], *d["lines"]]) for d in data["trace"]["double_applications"]]
    assert any(f"{DEEPSEEK}:" in m and "DeepseekV2MoE.forward_normal" in m for m in messages)
