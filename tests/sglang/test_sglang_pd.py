"""SGLang 0.5.23 prefill/decode-disaggregated, launched by speedtrap (``sglang_pd_stack.pd_tables``).

- greedy token ids through the PD router (prefill and decode on a core each, the KV over Mooncake's TCP
  transport) equal those of one plain SGLang server on the same model and prompts: the KV moved;
- ``inspect --manifest`` on the live stack: every role's pids, its ``SGLANG_*`` switches and its flags;
- the decode on the ``fake`` transfer backend (it moves no KV) is caught at the stack's first request, within
  ``target.request_timeout``, as an error naming the decode and the line of its log that says why.

The whole hunt over the example is ``test_sglang_pd_hunt.py`` (``-m stack``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import sglang_pd_stack as pd
from sglang_stack import start_sglang
from typer.testing import CliRunner

from speedtrap._errors import ServerError
from speedtrap.cli import app
from speedtrap.manifest import load_manifest
from speedtrap.stack import Launcher

pytestmark = pytest.mark.slow

PROMPTS = [[(7 * i + 13 * j) % 40000 + 100 for j in range(210)] for i in range(3)]  # token ids, about 210 each
TOKENS = 16
FAKE_TIMEOUT = 120  # the fake control's request limit (the prefill would wait 300 s for its decode)


def _manifest(tmp_path: Path, model: Path, **pd_kw: Any) -> Path:
    python, site = pd.ensure_python(), pd.ensure_packages()
    tables = pd.pd_tables(python, site, **pd_kw)
    tables["target"].update(model=str(model), served_model=str(model), request_timeout=FAKE_TIMEOUT)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "speedtrap.toml"
    path.write_text(pd.tables_text(tables))
    return path


def test_the_pd_router_answers_as_one_server_and_a_decode_without_kv_is_caught(
    stack: tuple[Path, Path], tmp_path: Path
) -> None:
    python, model = stack
    t0 = time.monotonic()
    with start_sglang(python, model, tmp_path / "single.log") as server:
        single_s = time.monotonic() - t0
        url = f"http://127.0.0.1:{server.port}"
        expected = [pd.run_router_request(url, ids, TOKENS)["output_ids"] for ids in PROMPTS]
    manifest = _manifest(tmp_path / "pd", model)
    loaded = load_manifest(manifest)
    target, patches = loaded.target, loaded.patches
    t1 = time.monotonic()
    stack_, launch_s = Launcher(target, patches).start((), tmp_path / "pd" / "t.log")
    with stack_:
        url = f"http://127.0.0.1:{stack_.port}"
        t2 = time.monotonic()
        got = [pd.run_router_request(url, ids, TOKENS) for ids in PROMPTS]
        request_s = (time.monotonic() - t2) / len(PROMPTS)
        inspected = CliRunner().invoke(app, ["inspect", "--manifest", str(manifest), "--json"])
        print(CliRunner().invoke(app, ["inspect", "--manifest", str(manifest)]).output)
        pids = stack_.pids()
    assert inspected.exit_code == 0, inspected.output
    roles = {r["role"]: r for r in json.loads(inspected.stdout)["roles"]}
    assert {name: r["guard_pid"] for name, r in roles.items()} == pids  # every role, by the kernel's pids
    for name, mode in (("prefill", "prefill"), ("decode", "decode")):
        argv = roles[name]["argv"]
        assert argv[argv.index("--disaggregation-mode") + 1] == mode and len(roles[name]["processes"]) >= 2
        assert roles[name]["switches"]["SGLANG_USE_CPU_ENGINE"] == "1"
    assert roles["prefill"]["switches"]["SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER"] == "1"
    assert "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER" not in roles["decode"]["switches"]
    print(f"single server ready {single_s:.0f} s; PD stack ready {launch_s:.0f} s; a request {request_s:.1f} s")
    assert [g["output_ids"] for g in got] == expected
    assert all(len(g["output_ids"]) == TOKENS for g in got)
    decode_log = (tmp_path / "pd" / "t.decode.log").read_text(errors="replace")
    assert "MC_FORCE_TCP is set, using TCP transport only" in decode_log  # the KV went over Mooncake's TCP

    loaded = load_manifest(_manifest(tmp_path / "fake", model, decode_transfer="fake"))
    target, patches = loaded.target, loaded.patches
    t3 = time.monotonic()
    with pytest.raises(ServerError) as caught:
        Launcher(target, patches).start((), tmp_path / "fake" / "t.log")
    caught_s = time.monotonic() - t3
    text = str(caught.value)
    print(f"fake decode caught in {caught_s:.0f} s (PD launch {time.monotonic() - t1:.0f} s in all): {text[:400]}")
    assert "role 'decode'" in text, text
    assert str(caught.value.log).endswith("t.decode.log")
    assert caught_s < target.start_timeout + FAKE_TIMEOUT + 60


@pytest.mark.stack
def test_a_prefill_without_its_cpu_switch_dies_on_the_first_request_named_with_its_log_line(
    stack: tuple[Path, Path], tmp_path: Path
) -> None:
    """Without ``SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER=1`` the prefill answers /health 200, then dies on its
    first real request (``pin_memory=True requires a CUDA ...``): speedtrap's first request names it."""
    _, model = stack
    loaded = load_manifest(_manifest(tmp_path, model, cp_switch=False))
    target, patches = loaded.target, loaded.patches
    t0 = time.monotonic()
    with pytest.raises(ServerError) as caught:
        Launcher(target, patches).start((), tmp_path / "t.log")
    text = str(caught.value)
    print(f"caught in {time.monotonic() - t0:.0f} s: {text[:500]}")
    assert "role 'prefill'" in text and "pin_memory" in text, text
    assert str(caught.value.log).endswith("t.prefill.log")
