"""The launch-line reader and rewriter of ``speedtrap init --pid``, over generated command lines (hypothesis)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from speedtrap.stack import render
from speedtrap.stack._procs import classify
from speedtrap.stack._rewrite import SWITCH_FLAGS, drop_secrets, port_flags, rewrite, rewrite_argv, split_switches

PORTS = st.integers(min_value=1024, max_value=65535)
WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_./", min_size=1, max_size=12)


@st.composite
def launches(draw: st.DrawFn) -> tuple[list[str], dict[int, str], str]:
    """A launch with ports in the places a launch names them (after a port flag, in a URL, after a URL), some
    other numbers and words, and the model path; the ports' placeholder names."""
    numbers = draw(st.lists(PORTS, min_size=1, max_size=4, unique=True))
    names = {n: ("port" if i == 0 else f"other.port.p{i}") for i, n in enumerate(numbers)}
    model = "/models/" + draw(WORD)
    argv = ["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", model]
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["port", "eqport", "url", "bootstrap", "word", "count"]))
        n = draw(st.sampled_from(numbers))
        if kind == "port":
            argv += [draw(st.sampled_from(["--port", "--nccl-port", "--disaggregation-bootstrap-port"])), str(n)]
        elif kind == "eqport":
            argv.append(f"--metrics-port={n}")
        elif kind == "url":
            argv += ["--decode", f"http://127.0.0.1:{n}"]
        elif kind == "bootstrap":
            argv += ["--prefill", f"http://127.0.0.1:{n}/", str(n)]
        elif kind == "word":
            argv += ["--" + draw(WORD).lstrip("-"), draw(WORD)]
        else:  # a count that equals a port: not a port (no port flag or URL before it)
            argv += ["--max-total-tokens", str(n)]
    return argv, names, model


@given(launches())
@settings(max_examples=300, deadline=None)
def test_rewritten_launch_renders_back_to_the_launch_that_ran(case: tuple[list[str], dict[int, str], str]) -> None:
    argv, names, model = case
    out = rewrite_argv(argv, names, model)
    values = {name: str(n) for n, name in names.items()} | {"model": model}
    assert render(out, values) == argv
    assert out[4] == "{model}"
    for i, a in enumerate(argv):
        if argv[i - 1] == "--max-total-tokens":
            assert out[i] == a  # a count is never taken for a port
        if argv[i - 1] in ("--port", "--nccl-port", "--disaggregation-bootstrap-port"):
            assert out[i] == "{" + names[int(a)] + "}"


@given(st.lists(st.sampled_from([*SWITCH_FLAGS["sglang"], "--dtype", "float32", "64", "--host", "x", "--port", "1"]),
                max_size=14))  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_split_switches_keeps_every_argument_once(rest: list[str]) -> None:
    argv = ["python", "-m", "sglang.launch_server", *rest]
    base, switches = split_switches("sglang", argv, 3)
    assert base[:3] == argv[:3]
    assert Counter(base) + Counter(a for s in switches for a in s.args) == Counter(argv)
    for s in switches:  # a switch is its flag and the values it takes, as they stood
        assert s.args[0] in SWITCH_FLAGS["sglang"]
        assert (
            len(s.args) == 1 + SWITCH_FLAGS["sglang"][s.args[0]] or len(s.args) < 1 + SWITCH_FLAGS["sglang"][s.args[0]]
        )
    assert not any(a in SWITCH_FLAGS["sglang"] for a in base[3:])


@given(st.lists(st.text(max_size=20), max_size=10))
@settings(max_examples=300, deadline=None)
def test_readers_take_any_command_line(argv: list[str]) -> None:
    argv = argv or ["x"]
    classify(tuple(argv))  # an engine or None, never an exception
    port_flags(argv)
    for a in argv:
        rewrite(a, {8000: "port"}, "/m")
    kept, _ = drop_secrets(argv)
    assert len(kept) <= len(argv)


def test_engines_and_roles_from_their_own_flags() -> None:
    py = "/v/bin/python"
    cases = {
        (py, "-m", "sglang.launch_server", "--disaggregation-mode", "prefill"): ("sglang", "prefill"),
        (py, "-m", "sglang.launch_server", "--disaggregation-mode=decode"): ("sglang", "decode"),
        (py, "-m", "sglang.launch_server", "--port", "1"): ("sglang", "server"),
        (py, "-m", "sglang_router.launch_router", "--pd-disaggregation"): ("sglang", "router"),
        (py, "/v/bin/vllm", "serve", "m", "--kv-transfer-config", '{"kv_role":"kv_producer"}'): ("vllm", "prefill"),
        (py, "-m", "vllm.entrypoints.openai.api_server", "--kv-transfer-config", '{"kv_role":"kv_consumer"}'): (
            "vllm", "decode"),
        (py, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"): ("vllm", "server"),
        (py, "proxy.py", "--port", "1", "--prefill", "http://a:2", "--decode", "http://a:3"): ("proxy", "router"),
        ("/usr/bin/llama-server", "-m", "x.gguf"): ("llama.cpp", "server"),
        (py, "/v/bin/speedtrap", "serve", "--port", "1"): ("speedtrap", "server"),
    }  # fmt: skip
    for argv, want in cases.items():
        e = classify(argv)
        assert e is not None and (e.engine, e.role) == want, (argv, e)
    assert classify((py, "-c", "import time")) is None
    assert classify(("/bin/bash", "-l")) is None


def test_secret_flags_are_left_out_by_name() -> None:
    kept, dropped = drop_secrets(["srv", "--api-key", "s3cr3t", "--token=abc", "--port", "1", "hf_abcdefghijklmnop"])
    assert kept == ["srv", "--port", "1"] and dropped[:2] == ["--api-key", "--token"]
