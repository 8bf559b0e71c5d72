"""``speedtrap record`` and ``check --against`` take ``module:function`` patches on hf: targets, as ``bisect`` does.

Ground truth by construction: ``factor_again_layer_1`` applies routed_scaling_factor a second time in
layer 1 (a double application); ``same_math_layer_1_mlp`` wraps an MLP in a module that calls it
unchanged (harmless). Before the one loader, both commands answered "unknown patch" (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localize_helpers import user_patch
from typer.testing import CliRunner

from speedtrap.cli import app

runner = CliRunner()
DOUBLE = user_patch("factor_again_layer_1")
HARMLESS = user_patch("same_math_layer_1_mlp")
TARGET = "hf:deepseek_v4"


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trusted build, recorded with the harmless user patch on (record takes user patches)."""
    out = tmp_path_factory.mktemp("gate") / "base.strec"
    code, _, err = run("record", "--target", TARGET, "--patches", HARMLESS, "--probe", "divergence", "--quick",
                       "--out", str(out), "--json")  # fmt: skip
    assert code == 0, err
    return out


def test_check_fails_on_a_user_patch_that_doubles_the_factor(recording: Path) -> None:
    code, out, err = run("check", "--against", str(recording), "--target", TARGET, "--patches", DOUBLE, "--json")
    assert code == 1, err
    (check,) = json.loads(out)["checks"]
    assert check["name"] == "worst.kl_p99" and not check["passed"] and check["value"] > 0.1


def test_check_passes_the_harmless_user_patch(recording: Path) -> None:
    code, out, err = run("check", "--against", str(recording), "--target", TARGET, "--patches", HARMLESS, "--json")
    assert code == 0, err
    (check,) = json.loads(out)["checks"]
    assert check["passed"] and check["value"] <= 0.1


def test_an_unknown_entry_point_is_one_line_before_any_load(recording: Path) -> None:
    code, _, err = run("check", "--against", str(recording), "--target", TARGET, "--patches", "nosuchmod:fn")
    assert code == 2 and "Traceback" not in err and "nosuchmod" in err
