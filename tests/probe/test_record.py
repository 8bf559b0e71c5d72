"""Recordings as baselines: in-process and over HTTP equal to the live baseline to 1e-6 nats; resume; the gate.

Ground truth in-process is brute force from the live baseline's full logits (top-k + tail bucket computed
here, in probability space); over HTTP it is the live two-server comparison on the same sequences.
"""

from __future__ import annotations

import asyncio
import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from probe_helpers import SIGMA, Server, clean_env, free_port, noisy, serve_argv, start_server, stop_server
from typer.testing import CliRunner

from speedtrap.cli import app
from speedtrap.probe import (
    DivergenceReport,
    DivergenceSettings,
    HttpBackend,
    InProcessBackend,
    KLStats,
    Recording,
    RecordingError,
    adivergence_against,
    read_recording,
    record,
    run_against,
    run_divergence,
)
from speedtrap.probe._recording_format import RecordingWriter, parse_recording
from speedtrap.targets._base import InProcessModel

SETTINGS = DivergenceSettings(lengths=(64,), sequences=2, decode_tokens=8, bucket_size=32, top_k=20)
HTTP_SETTINGS = DivergenceSettings(lengths=(128,), sequences=1, decode_tokens=8, bucket_size=64, top_k=10)
TOL = 1e-6
FIGURES = ("kl_mean", "kl_median", "kl_p90", "kl_p99", "kl_max", "same_top1", "rms_dp")


@pytest.fixture(scope="module")
def in_process_recording(smol: InProcessModel, tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return record(InProcessBackend(smol), tmp_path_factory.mktemp("rec") / "base.strec", divergence=SETTINGS,
                  progress=False)  # fmt: skip


def _brute_stats(base: InProcessBackend, cand: InProcessBackend, ids: list[int], k: int) -> dict[str, list[Any]]:
    """Per phase: (position, KL over the baseline's top-k + the rest, same argmax, dp), from full logits."""
    n, d = len(ids), SETTINGS.decode_tokens
    rows = {
        "prefill": (base.prefill_logits(ids)[:-1], cand.prefill_logits(ids)[:-1], ids[1:], 1),
        "decode": (base.decode_logits(ids, d), cand.decode_logits(ids, d), ids[n - d :], n - d),
    }
    out: dict[str, list[Any]] = {}
    for phase, (bl, cl, truths, first) in rows.items():
        p, q = bl.double().softmax(-1), cl.double().softmax(-1)
        top = p.topk(k).indices
        mask = torch.ones_like(p, dtype=torch.bool).scatter(-1, top, False)
        pt, qt = p.gather(-1, top), q.gather(-1, top)
        rest_p, rest_q = (p * mask).sum(-1), (q * mask).sum(-1)
        kl = (pt * (pt.log() - qt.log())).sum(-1) + torch.where(rest_p > 0, rest_p * (rest_p / rest_q).log(), 0.0)
        t = torch.tensor(truths).unsqueeze(-1)
        dp = (q.gather(-1, t) - p.gather(-1, t)).squeeze(-1)
        same = top[:, 0] == q.argmax(-1)
        out[phase] = [(first + i, float(kl[i]), bool(same[i]), float(dp[i])) for i in range(len(truths))]
    return out


def _assert_close(a: KLStats, b: KLStats) -> None:
    assert a.tokens == b.tokens
    for name in FIGURES:
        assert abs(getattr(a, name) - getattr(b, name)) <= TOL, (name, getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("patch", ["hash_topk_routed_scaling", pytest.param("lm_head_bf16", marks=pytest.mark.slow)])
def test_in_process_recording_equals_the_live_baseline(
    smol: InProcessModel, in_process_recording: Recording, patch: str
) -> None:
    base, cand = InProcessBackend(smol), InProcessBackend(smol, [patch])
    recorded = asyncio.run(adivergence_against(in_process_recording, cand, progress=False))
    brute: dict[str, list[Any]] = {"prefill": [], "decode": []}
    for seq in sorted(in_process_recording.sequences, key=lambda s: s.key):
        for phase, stats in _brute_stats(base, cand, list(seq.tokens), SETTINGS.top_k).items():
            brute[phase].extend(stats)
    exact = run_divergence(base, cand, SETTINGS, progress=False)  # the full-vocabulary KL
    for phase in ("prefill", "decode"):
        kl = [s[1] for s in brute[phase]]
        live = KLStats.of(kl, [s[2] for s in brute[phase]], [s[3] for s in brute[phase]])
        _assert_close(recorded.phases[phase].overall, live)
        for bucket in recorded.phases[phase].by_bucket:
            inside = [s for s in brute[phase] if bucket.start <= s[0] < bucket.end]
            _assert_close(bucket.stats, KLStats.of([s[1] for s in inside], [s[2] for s in inside],
                                                   [s[3] for s in inside]))  # fmt: skip
        # A lower bound of the full KL (data processing), and not a vacuous one.
        assert recorded.phases[phase].overall.kl_max <= exact.phases[phase].overall.kl_max + TOL
        assert recorded.phases[phase].overall.kl_mean >= 0.5 * exact.phases[phase].overall.kl_mean
    assert recorded.phases["prefill"].overall.kl_mean > (0.1 if patch == "hash_topk_routed_scaling" else 1e-6)
    assert recorded.approximation and "lower bound" in recorded.approximation


class InterruptedAfter(InProcessBackend):
    def __init__(self, model: InProcessModel, after: int) -> None:
        super().__init__(model)
        self.after, self.calls = after, 0

    def prefill_logits(self, ids: Any) -> Any:
        if self.calls >= self.after:
            raise KeyboardInterrupt
        self.calls += 1
        return super().prefill_logits(ids)


@pytest.mark.slow
def test_an_interrupted_record_resumes_to_the_same_recording(
    smol: InProcessModel, in_process_recording: Recording, tmp_path: Path
) -> None:
    out = tmp_path / "r.strec"
    with pytest.raises(KeyboardInterrupt):
        record(InterruptedAfter(smol, 1), out, divergence=SETTINGS, progress=False)
    with pytest.raises(RecordingError, match="interrupted"):
        read_recording(out)
    data = out.read_bytes()
    out.write_bytes(data + data[:30])  # and a half-written record after it (the start of a gzip member)
    again = InterruptedAfter(smol, 100)
    resumed = record(again, out, divergence=SETTINGS, resume=True, progress=False)
    assert again.calls == 1  # only the missing sequence ran
    by_key = {s.key: s for s in in_process_recording.sequences}
    for seq in resumed.sequences:
        ref = by_key[seq.key]
        assert seq.tokens == ref.tokens
        assert (seq.prefill.logprobs == ref.prefill.logprobs).all() and (seq.decode.ids == ref.decode.ids).all()
    with pytest.raises(Exception, match="lengths"):  # other settings cannot resume it
        record(InProcessBackend(smol), out, divergence=DivergenceSettings(lengths=(72,), decode_tokens=8),
               resume=True, progress=False)  # fmt: skip


# -- the gate, in-process (the CLI's model load replaced by the session's model) ---------------------


@pytest.fixture
def cli_model(smol: InProcessModel, monkeypatch: pytest.MonkeyPatch) -> InProcessModel:
    import speedtrap.cli._probe_common as cli_common

    monkeypatch.setattr(cli_common, "_load_smol", lambda target, overrides, patches=None: smol)
    return smol


def _check(*args: str) -> Any:
    return CliRunner().invoke(app, ["check", *args])


@pytest.mark.slow
def test_check_exit_codes_and_junit(cli_model: InProcessModel, in_process_recording: Recording, tmp_path: Path) -> None:
    rec = in_process_recording.path
    passed = _check("--against", rec, "--target", "smol-moe", "--patches", "fused_rmsnorm", "--junit",
                    str(tmp_path / "ok.xml"))  # fmt: skip
    assert passed.exit_code == 0, passed.output
    assert "speedtrap check: pass" in passed.output
    bounds = ["--bound", "worst.kl_p99<=0.1", "--bound", "prefill.same_top1>=0.9"]
    failed = _check("--against", rec, "--target", "smol-moe", "--patches", "hash_topk_routed_scaling", "--junit",
                    str(tmp_path / "bad.xml"), *bounds)  # fmt: skip
    assert failed.exit_code == 1, failed.output
    assert "regression: worst.kl_p99 = " in failed.output and "> bound 0.1" in failed.output
    ok_suite = ET.parse(tmp_path / "ok.xml").getroot().find("testsuite")
    assert ok_suite is not None and ok_suite.get("failures") == "0" and ok_suite.get("tests") == "1"
    bad_suite = ET.parse(tmp_path / "bad.xml").getroot().find("testsuite")
    assert bad_suite is not None and bad_suite.get("failures") == "2"
    cases = {c.get("name"): c for c in bad_suite.iter("testcase")}
    failure = cases["worst.kl_p99"].find("failure")
    assert failure is not None and "bound 0.1" in str(failure.get("message"))
    as_json = _check("--against", rec, "--target", "smol-moe", "--patches", "hash_topk_routed_scaling", "--json")
    data = json.loads(as_json.stdout)
    assert as_json.exit_code == 1 and data["status"] == "regression" and data["exit_code"] == 1
    usage = _check("--against", rec, "--target", "smol-moe", "--bound", "kl<0.1")
    assert usage.exit_code == 2 and "METRIC<=VALUE" in usage.output


@pytest.mark.slow
def test_a_floor_stored_with_the_recording_sets_the_checks_bound(
    cli_model: InProcessModel, in_process_recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a noisy stack (fresh noise on every forward's logits), the unpatched build fails the fixed bound
    and passes the bound derived from the floor that ``probe repeat --into`` stored in the recording."""
    import shutil

    import speedtrap.cli._repeat as cli_repeat

    monkeypatch.setattr(cli_repeat, "_load_smol", lambda target, overrides, patches=None: cli_model)
    rec = tmp_path / "base.strec"
    shutil.copy(in_process_recording.path, rec)
    with noisy(cli_model, SIGMA):
        stored = CliRunner().invoke(app, ["probe", "repeat", "--lengths", "64", "--sequences", "2", "--batch", "1",
                                          "--into", str(rec)])  # fmt: skip
        assert stored.exit_code == 0, stored.output
        floor = read_recording(rec).floor
        assert floor is not None and floor.overall.kl_p99 > 0.01
        fixed = _check("--against", str(rec), "--target", "smol-moe", "--bound", "worst.kl_p99<=0.1")
        derived = _check("--against", str(rec), "--target", "smol-moe")
        culprit = _check("--against", str(rec), "--target", "smol-moe", "--patches", "hash_topk_routed_scaling")
    assert fixed.exit_code == 1, fixed.output  # the fixed bound blames the stack's own noise
    assert derived.exit_code == 0, derived.output
    assert "derived from the noise floor" in derived.output and "stored with the recording" in derived.output
    assert culprit.exit_code == 1, culprit.output  # the seed bug still fails the derived bound
    assert read_recording(in_process_recording.path).floor is None  # the original is untouched


def test_the_subcommands_of_check_still_work(cli_model: InProcessModel) -> None:
    result = CliRunner().invoke(app, ["check", "--help"])
    assert result.exit_code == 0 and "equivalence" in result.output and "--against" in result.output


def _tampered(recording: Recording, tmp_path: Path, **identity: Any) -> Path:
    raw = parse_recording(recording.data, "x")
    header = dict(raw.header, identity={**raw.header["identity"], **identity})
    out = tmp_path / "tampered.strec"
    writer = RecordingWriter(out, header)
    for seq in raw.sequences:
        writer.write(seq.to_json())
    writer.write({"type": "end"})
    writer.close()
    return out


@pytest.mark.parametrize(
    ("identity", "needle"),
    [({"tokenizer": "0000000000000000"}, "another tokenizer"), ({"vocab_size": 32000}, "32000 tokens"),
     ({"model": "llama"}, "model 'llama'"), ({"source": "http"}, "over HTTP")],
)  # fmt: skip
def test_another_tokenizer_or_model_is_refused_in_one_line(
    cli_model: InProcessModel, in_process_recording: Recording, tmp_path: Path, identity: dict[str, Any], needle: str
) -> None:
    path = _tampered(in_process_recording, tmp_path, **identity)
    result = _check("--against", str(path), "--target", "smol-moe")
    assert result.exit_code == 2, result.output
    assert needle in result.output and "fix:" in result.output and "Traceback" not in result.output


# -- over HTTP: a baseline server recorded, a patched server compared live and against the recording ---


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("patched") / "patched.log"
    server = start_server(serve_argv(port), port, log, clean_env(SPEEDTRAP_SMOLMOE_LM_HEAD_BF16="1",
                                                                 SPEEDTRAP_SMOLMOE_MHC_BF16_GEMM="1"))  # fmt: skip
    yield server
    stop_server(server)


def _phases_close(a: DivergenceReport, b: DivergenceReport) -> None:
    assert a.sequence_tokens == b.sequence_tokens
    for phase in ("prefill", "decode"):
        _assert_close(a.phases[phase].overall, b.phases[phase].overall)
        for x, y in zip(a.phases[phase].by_bucket, b.phases[phase].by_bucket, strict=True):
            _assert_close(x.stats, y.stats)


@pytest.mark.slow
def test_http_recording_equals_the_live_baseline(served: Server, patched: Server, tmp_path: Path) -> None:
    rec = record(HttpBackend(served.url), tmp_path / "http.strec", divergence=HTTP_SETTINGS, progress=False)
    assert rec.identity.source == "http" and rec.identity.model == "smol-moe"
    live = run_divergence(HttpBackend(served.url), HttpBackend(patched.url), HTTP_SETTINGS, progress=False)
    against = run_against(rec, HttpBackend(patched.url), ["divergence"], progress=False).divergence
    assert against is not None
    _phases_close(against, live)
    assert live.phases["prefill"].overall.kl_mean > 1e-6  # the patches do change the distributions
    itself = run_against(rec, HttpBackend(served.url), ["divergence"], progress=False).divergence
    assert itself is not None and itself.phases["prefill"].overall.kl_max < 1e-9  # float32 storage: ~1e-13
    # The gate over HTTP: the baseline server passes, the patched one fails a strict bound.
    ok = _check("--against", str(rec.path), "--target", served.url, "--bound", "worst.kl_p99<=1e-9")
    assert ok.exit_code == 0, ok.output
    bad = _check("--against", str(rec.path), "--target", patched.url, "--bound", "worst.kl_p99<=1e-9")
    assert bad.exit_code == 1 and "regression: worst.kl_p99" in bad.output
    assert math.isfinite(float(json.loads(_check("--against", str(rec.path), "--target", patched.url,
                                                 "--json").stdout)["checks"][0]["value"]))  # fmt: skip


@pytest.mark.slow
def test_bisect_on_fail_names_the_constructed_culprit(
    cli_model: InProcessModel, in_process_recording: Recording, tmp_path: Path
) -> None:
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(
        '[target]\nname = "smol-moe"\n\n'
        + "".join(
            f'[[patches]]\nname = "{p}"\n\n' for p in ("fused_rmsnorm", "hash_topk_routed_scaling", "lm_head_bf16")
        )
        + '[probe]\nkind = "divergence"\n\n[verdict]\nbound = 0.1\n'
    )
    result = _check("--against", in_process_recording.path, "--target", "smol-moe", "--patches",
                    "fused_rmsnorm,hash_topk_routed_scaling,lm_head_bf16", "--manifest", str(manifest),
                    "--bisect-on-fail", "--run-dir", str(tmp_path / "hunt"))  # fmt: skip
    assert result.exit_code == 1, result.output
    lines = result.stdout.strip().splitlines()
    assert "REGRESSION" in result.stdout
    assert lines[-1] == "culprits: hash_topk_routed_scaling"


@pytest.mark.slow
def test_recall_against_a_recording_scores_the_drop_and_the_changed_answers(
    smol: InProcessModel, tmp_path: Path
) -> None:
    from speedtrap.probe import RecallSettings, run_recall

    settings = RecallSettings(lengths=(128,), depths=(0.2, 0.8), samples=1, max_new_tokens=12)
    rec = record(InProcessBackend(smol), tmp_path / "recall.strec", recall=settings, progress=False)
    assert rec.kinds == ["recall"] and len(rec.samples) == 2
    same = run_against(rec, InProcessBackend(smol), progress=False).recall
    assert same is not None and same.changed == [] and same.drop == 0.0 and same.overlap
    patched = InProcessBackend(smol, ["hash_topk_routed_scaling"])
    against = run_against(rec, patched, progress=False).recall
    live = run_recall(InProcessBackend(smol, ["hash_topk_routed_scaling"]), settings, progress=False)
    assert against is not None and against.candidate.answers() == live.answers()
    expected = sorted(k for k, v in live.answers().items() if rec_answers(rec)[k] != v)
    assert against.changed == expected
    assert against.drop == pytest.approx(same.baseline.overall.accuracy - live.overall.accuracy)


def rec_answers(rec: Recording) -> dict[str, str]:
    return {s.id: s.answer for s in rec.samples}


@pytest.mark.slow
def test_a_regression_is_exit_1_even_when_the_hunt_after_it_fails(
    cli_model: InProcessModel, in_process_recording: Recording, tmp_path: Path
) -> None:
    manifest = tmp_path / "speedtrap.toml"  # no [verdict]: the failed bound is the rule; a patch smol-moe lacks
    manifest.write_text('[target]\nname = "smol-moe"\n\n[[patches]]\nname = "no_such_patch"\n')
    result = _check("--against", in_process_recording.path, "--target", "smol-moe", "--patches",
                    "hash_topk_routed_scaling", "--manifest", str(manifest), "--bisect-on-fail", "--json",
                    "--run-dir", str(tmp_path / "hunt"))  # fmt: skip
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["status"] == "regression" and data["bisect"] is None
    assert "no_such_patch" in data["bisect_error"] and "verdict.bound is missing" not in data["bisect_error"]
