"""``speedtrap diff layers`` and ``speedtrap check scale`` on hf: targets (in-process CLI runs)."""

from __future__ import annotations

import json
from pathlib import Path

from localize_helpers import user_patch
from safetensors.torch import load_file
from typer.testing import CliRunner

from speedtrap.cli import app
from speedtrap.localize import LayerDiffResult, ScaleCheckResult

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_check_scale_json_reports_two_in_the_patched_layers() -> None:
    code, out, _ = run(
        "check", "scale", "--target", "hf:deepseek_v4", "--patches", user_patch("factor_again_layer_1"), "--json"
    )
    assert code == 0
    result = ScaleCheckResult.from_json(json.loads(out))
    assert result.times_by_layer() == {0: 1, 1: 2, 2: 1, 3: 1}
    assert not result.exactly_once
    assert ScaleCheckResult.from_json(result.to_json()) == result


def test_check_scale_human_output_and_values() -> None:
    code, out, _ = run("check", "scale", "--target", "hf:deepseek_v3", "--values", "1,2,3")
    assert code == 0
    assert "applied exactly once everywhere" in out
    assert "values [1.0, 2.0, 3.0]" in out


def test_diff_layers_json_names_the_first_divergent_module_and_dumps(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    code, out, _ = run(
        "diff",
        "layers",
        "--target",
        "hf:mixtral",
        "--patches",
        user_patch("bf16_layer_2_o_proj"),
        "--tokens",
        "20",
        "--dump",
        str(dump),
        "--json",
    )
    assert code == 0
    result = LayerDiffResult.from_json(json.loads(out))
    assert result.first_divergent == "hf.model.layers.2.self_attn.o_proj"
    assert LayerDiffResult.from_json(result.to_json()) == result
    # The dumped pair of the first divergent module gives back its rel_diff.
    (file,) = dump.glob("*-hf.model.layers.2.self_attn.o_proj.safetensors")
    tensors = load_file(str(file))
    x, y = tensors["baseline.0"].double(), tensors["patched.0"].double()
    rel = 1 - 2 * float((x * y).sum()) / float((x * x + y * y).sum())
    first = result.module("hf.model.layers.2.self_attn.o_proj")
    assert first.rel_diff is not None and abs(rel - first.rel_diff) <= 1e-6 * first.rel_diff + 1e-15


def test_diff_layers_human_output_with_threshold() -> None:
    code, out, _ = run(
        "diff", "layers", "--target", "hf:mixtral", "--patches", user_patch("bf16_layer_2_o_proj"), "--threshold", "1"
    )
    assert code == 0
    assert "no module over rel_diff 1" in out
    assert "error growth across layers" in out


def test_bad_input_is_one_line_and_exit_code_2() -> None:
    cases = [
        (("check", "scale", "--target", "hf:deepseek_v3", "--param", "nope"), "has no parameter 'nope'"),
        (("check", "scale", "--target", "hf:nope_model"), "neither a known model type"),
        (("diff", "layers", "--target", "hf:mixtral", "--patches", "nope.mod:f"), "cannot import module 'nope.mod'"),
        (
            ("diff", "layers", "--target", "hf:deepseek_v4", "--patches", user_patch("fails_to_apply")),
            "failed to apply",
        ),
        (
            ("diff", "layers", "--target", "hf:deepseek_v4", "--patches", user_patch("raises_in_forward")),
            "raised during forward",
        ),
        (("diff", "layers", "--target", "hf:mixtral"), "no patches to compare"),
        (("check", "scale", "--target", "hf:deepseek_v3", "--values", "1,x"), "not a comma-separated list"),
    ]
    for args, message in cases:
        code, out, err = run(*args)
        assert code == 2, (args, out, err)
        assert message in err, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 3
