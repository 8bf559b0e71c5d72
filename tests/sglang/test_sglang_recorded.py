"""A recorded baseline through SGLang's /generate: the recording and the trials are keyed alike (by token id).

Against ``serve --dialect sglang`` (the imitation, checked against the real server in test_sglang_dialect.py):
the benchmark over the real SGLang example (benchmarks/bench_sglang.py) once failed its first trial because
the baseline had been recorded through the OpenAI endpoints (tokens named by text) while the trials, with
``api = "sglang"``, read ids: "one side names tokens by id and the other by text".
"""

from __future__ import annotations

import sys
from pathlib import Path

from speedtrap.isolate import ServerOracle, TrialRequest
from speedtrap.manifest import ProbeSpec
from speedtrap.probe import read_recording
from speedtrap.stack import TargetSpec

SERVE = (sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--dialect", "sglang",
         "--port", "{port}", "--threads", "1", "--name", "MODEL_DIR")  # fmt: skip
SETTINGS = {"lengths": [64], "decode_tokens": 4, "bucket_size": 64, "top_k": 5}


def test_the_baseline_is_recorded_through_the_probes_api_and_a_trial_compares_with_it(tmp_path: Path) -> None:
    target = TargetSpec(launch=SERVE, served_model="MODEL_DIR", start_timeout=300, env=(("OMP_NUM_THREADS", "1"),))
    probe = ProbeSpec(kind="divergence", preset="quick", settings=SETTINGS, api="sglang")
    oracle = ServerOracle(target, (), probe)
    try:
        oracle.prepare(tmp_path)
        assert read_recording(tmp_path / "reference.strec").identity.api == "sglang"
        m = oracle.measure(TrialRequest((), 0, tmp_path, "trial-0001"), 1)
    finally:
        oracle.close()
    assert oracle.recording_launches == 1
    assert m.figures["worst.kl_p99"] < 1e-9  # the same engine and weights, one thread (2.7e-14 measured)
