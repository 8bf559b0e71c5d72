"""Your own model and your own patches, end to end (issue: one model of targets and patches).

Ground truth by construction: ``factor_again_layer_1`` applies routed_scaling_factor a second time in
layer 1, ``drop_factor_layer_2`` pins it to 1.0 in layer 2's router, ``same_math_layer_1_mlp`` wraps
an MLP in a module that calls it unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localize_helpers import user_patch
from typer.testing import CliRunner

from speedtrap.cli import app

runner = CliRunner()
HARMFUL = (user_patch("factor_again_layer_1"), user_patch("drop_factor_layer_2"))
HARMLESS = user_patch("same_math_layer_1_mlp")


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_run_on_a_transformers_model_with_user_patches_names_the_two_harmful_ones(tmp_path: Path) -> None:
    patches = ",".join([HARMFUL[0], HARMLESS, HARMFUL[1]])
    out_dir = tmp_path / "run"
    code, out, err = run("run", "--target", "hf:deepseek_v4", "--patches", patches, "--quick", "--out", str(out_dir),
                         "--json")  # fmt: skip
    assert code == 0, err
    verdict = json.loads(out)["verdict"]
    assert {tuple(c["patches"]) for c in verdict["culprits"]} == {(HARMFUL[0],), (HARMFUL[1],)}
    report = json.loads((out_dir / "report.json").read_text())
    stages = {s["name"]: (s["status"], s["detail"]) for s in report["run"]["stages"]}
    for stage in ("triage", "isolate", "evidence", "localize", "report"):
        assert stages[stage][0] == "done", stages
    assert stages["probes"][0] == "skipped" and "needs a tokenizer" in stages["probes"][1]
    # Localization says what the construction did: twice in layer 1, never in layer 2.
    evidence = " ".join(verdict["evidence"])
    assert "layer 1: exponent ≈ 2.00, applied twice" in evidence
    assert "layer 2: exponent ≈ 0.00, never applied" in evidence
    assert {tuple(loc["patches"]) for loc in report["localization"]} == {(HARMFUL[0],), (HARMFUL[1],)}
    # No diff was given for any patch: the verdict does not cite triage.
    assert not any(line.startswith("Triage") for line in verdict["evidence"])


def test_probe_divergence_on_a_tokenizer_less_model_runs_on_synthetic_ids() -> None:
    code, out, err = run("probe", "divergence", "--target", "hf:deepseek_v4", "--patches", HARMFUL[0], "--quick",
                         "--json")  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["phases"]["prefill"]["overall"]["kl_p99"] > 0


def test_probe_recall_on_a_tokenizer_less_model_is_one_line() -> None:
    code, _, err = run("probe", "recall", "--target", "hf:deepseek_v4", "--quick")
    assert code == 2
    assert "need a tokenizer and a chat template" in err and "Traceback" not in err


def test_bisect_takes_user_patches_on_a_transformers_model(tmp_path: Path) -> None:
    code, out, err = run("bisect", "--target", "hf:deepseek_v3", "--patches", f"{HARMFUL[0]},{HARMLESS}",
                         "--run-dir", str(tmp_path / "b"), "--json")  # fmt: skip
    assert code == 0, err
    culprits = [c["patches"] for c in json.loads(out)["culprits"]]
    assert culprits == [[HARMFUL[0]]]


def test_an_error_message_keeps_its_brackets(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_ray(name: str, *args: object, **kwargs: object) -> object:
        if name == "ray" or name.startswith("ray."):
            raise ImportError("no ray here")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_ray)
    code, _, err = run("bisect", "--target", "hf:deepseek_v3", "--executor", "ray")
    assert code == 2
    assert "pip install 'speedtrap[ray]'" in err


@pytest.mark.slow
def test_run_on_the_gguf_dense_model_with_a_user_patch(tmp_path: Path) -> None:
    from speedtrap.targets.smolmoe import default_gguf_path

    gguf = default_gguf_path()
    culprit = user_patch("mlp_times_2_25_first_3_layers")
    patches = f"{culprit},{HARMLESS}"
    code, out, err = run("run", "--target", f"hf:{gguf}", "--patches", patches, "--symbol", "", "--quick",
                         "--out", str(tmp_path / "run"), "--json")  # fmt: skip
    assert code == 0, err
    verdict = json.loads(out)["verdict"]
    assert [c["patches"] for c in verdict["culprits"]] == [[culprit]]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["recall"], "a GGUF model brings its tokenizer and chat template: recall runs"
    first = report["localization"][0]["layers"]["first_divergent"]
    assert first.startswith("hf.model.layers.0.")
