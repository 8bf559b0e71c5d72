"""Fuzzing what users and servers hand us: every case ends in a result or one line (exit 2), never a traceback.

- manifests (``speedtrap triage --manifest`` on the CLI, isolate's loader), from TOML built of the
  manifests' own field names and values, and from a valid manifest cut or damaged at random;
- diffs (``speedtrap triage --patch FILE --tree DIR`` on the CLI);
- server JSON: answers of OpenAI-, vLLM-, SGLang- and llama.cpp-shaped servers, built from their
  keys with random leaves, fed through the HTTP backend for every call a probe makes in every dialect;
- input files through :data:`FILE_LOADERS`: manifests, diffs, recordings and noise-floor files (a new
  format adds its loader there and every case here runs on it too).

Run directories edited by hand are fuzzed in ``tests/report/test_report_fuzz.py`` (they need a real run).
``SPEEDTRAP_FUZZ_EXAMPLES`` sets the cases per test; the counts are printed at the end of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedtrap._errors import SpeedtrapError
from speedtrap.cli import app

EXAMPLES = int(os.environ.get("SPEEDTRAP_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
runner = CliRunner()


def _one_line_or_ok(result: Any) -> None:
    """A CLI result: exit 0, or exit 2 with one error line; never an exception escaping."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback: {type(result.exception).__name__}: {result.exception}") from result.exception
    assert result.exit_code in (0, 2), (result.exit_code, result.stderr[-500:])
    if result.exit_code == 2:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-500:]


def _typed(fn: Callable[[], Any]) -> None:
    """A library call: a result or a SpeedtrapError with a one-line message."""
    try:
        fn()
    except SpeedtrapError as exc:
        assert "\n" not in exc.one_line()


# ----------------------------------------------------------------------------------------------
# Manifests.

MANIFEST_KEYS = [
    "name", "launch", "health", "env", "args", "config", "diff", "gate", "summary", "requires", "conflicts",
    "model", "served_model", "start_timeout", "stop_timeout", "retries", "overrides", "cwd", "config_args",
    "kind", "argv", "settings", "preset", "timeout", "rule", "metric", "bound", "near", "repeats", "prior",
    "parallel", "executor", "address", "resources", "tree", "X",
]  # fmt: skip
_scalar = st.one_of(
    st.integers(-3, 10**6), st.floats(allow_nan=True), st.booleans(),
    st.sampled_from(["{port}", "{model}", "http://127.0.0.1:{port}/health", "p0", "p1", "env", "flag", "config",
                     "ungated", "recall", "divergence", "command", "threshold", "recall_drop", "quick", "", "../x",
                     "ray", "local", "/no/such/file.diff", "é\x00", "[[patches]]"]),
    st.text(max_size=12),
)  # fmt: skip
_value = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(MANIFEST_KEYS), inner, max_size=3),
    max_leaves=6,
)


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return repr(value) if isinstance(value, (int, float)) else json.dumps(value)


_table = st.dictionaries(st.sampled_from(MANIFEST_KEYS), _value, max_size=5)
_document = st.tuples(
    st.dictionaries(st.sampled_from(["target", "probe", "verdict", "search", "X"]), _table, max_size=4),
    st.lists(_table, max_size=3),
    st.dictionaries(st.sampled_from(["tree", "X"]), _value, max_size=1),
).map(
    lambda t: "\n".join(
        [*(f"{k} = {_toml(v)}" for k, v in t[2].items())]
        + [f"[{name}]\n" + "\n".join(f"{k} = {_toml(v)}" for k, v in table.items()) for name, table in t[0].items()]
        + ["[[patches]]\n" + "\n".join(f"{k} = {_toml(v)}" for k, v in p.items()) for p in t[1]]
    )
)

VALID_MANIFEST = """\
[target]
launch = ["server", "--port", "{port}"]
health = "http://127.0.0.1:{port}/health"

[probe]
kind = "recall"

[[patches]]
name = "fast_norm"
env = { FAST_NORM = "1" }

[[patches]]
name = "bad_gemm"
args = ["--bad-gemm"]
requires = ["fast_norm"]
"""


@st.composite
def _damaged(draw: st.DrawFn, text: str) -> str:
    """A valid file cut, with a line dropped, or with bytes inserted, at random places."""
    how = draw(st.sampled_from(["cut", "drop", "insert"]))
    if how == "cut":
        return text[: draw(st.integers(0, len(text)))]
    lines = text.splitlines()
    at = draw(st.integers(0, len(lines) - 1))
    if how == "drop":
        return "\n".join(lines[:at] + lines[at + 1 :])
    return "\n".join([*lines[:at], draw(st.text(max_size=20)), *lines[at:]])


@contextlib.contextmanager
def _written(text: str | bytes, name: str) -> Iterator[Path]:
    """The case as a file in a fresh folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as folder:
        path = Path(folder) / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        yield path


@FUZZ
@given(st.one_of(_document, _damaged(VALID_MANIFEST), st.binary(max_size=200)))
def test_manifests_fail_in_one_line(fuzz_cases: Counter[str], text: str | bytes) -> None:
    from speedtrap.manifest import load_manifest

    with _written(text, "speedtrap.toml") as path:
        _one_line_or_ok(runner.invoke(app, ["triage", "--manifest", str(path), "--json"]))
        _typed(lambda: load_manifest(path))
    fuzz_cases["manifests (triage CLI + isolate loader)"] += 1


# ----------------------------------------------------------------------------------------------
# Diffs.

_diff_line = st.one_of(
    st.sampled_from(["diff --git a/m.py b/m.py", "--- a/m.py", "+++ b/m.py", "--- /dev/null", "+++ /dev/null",
                     "@@ -1,3 +1,3 @@", "@@ -1 +1 @@", "@@ -0,0 +1,2 @@", " x = 1", "-x = 1", "+x = 2",
                     "+    return a * 2.5", "\\ No newline at end of file", "new file mode 100644",
                     "rename from m.py", "rename to n.py", "Binary files a/b and b/b differ", "index 1..2 100644"]),
    st.text(max_size=30),
)  # fmt: skip
_diff = st.lists(_diff_line, max_size=14).map("\n".join)


@FUZZ
@given(st.one_of(_diff, st.binary(max_size=200)))
def test_diffs_fail_in_one_line(fuzz_cases: Counter[str], text: str | bytes) -> None:
    with _written(text, "change.diff") as path:
        tree = path.parent / "tree"
        tree.mkdir()
        (tree / "m.py").write_text("x = 1\ny = 2\n\ndef f(a):\n    return a * 2.5\n")
        _one_line_or_ok(runner.invoke(app, ["triage", "--patch", str(path), "--tree", str(tree), "--json"]))
    fuzz_cases["diffs (triage CLI)"] += 1


# ----------------------------------------------------------------------------------------------
# Server JSON, through the HTTP backend.

SERVER_KEYS = [
    # OpenAI / vLLM
    "data", "id", "max_model_len", "choices", "message", "content", "role", "finish_reason", "usage",
    "prompt_tokens", "completion_tokens", "logprobs", "tokens", "token_logprobs", "top_logprobs", "text_offset",
    "text", "prompt_logprobs", "logprob", "rank", "decoded_token", "count", "error", "detail",
    # SGLang
    "meta_info", "input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs",
    # llama.cpp
    "completion_probabilities", "probs", "tok_str", "prob", "token", "bytes",
]  # fmt: skip
_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**5), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["smol-moe", "default", "token_id:5", "token_id:x", "stop", "length", "w1", ""]),
    st.text(max_size=6),
)  # fmt: skip
_json = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(SERVER_KEYS), inner, max_size=4),
    max_leaves=20,
)
# Each endpoint's documented shape with random leaves (mostly the right type), so the fuzz reaches the
# parsers' deeper checks, not only "not a dict".
_num = st.one_of(st.integers(-2, 50), st.floats(-30, 1, allow_nan=False), _leaf)
_tok = st.one_of(st.integers(0, 50), st.sampled_from(["w1", "w2", "token_id:3", "token_id:x"]), _leaf)
_top = st.one_of(st.none(), st.dictionaries(st.sampled_from(["w1", "w2", "token_id:3"]), _num, max_size=3), _leaf)
_usage = st.fixed_dictionaries({}, optional={"prompt_tokens": _num, "completion_tokens": _num})
_logprobs = st.fixed_dictionaries(
    {}, optional={"tokens": st.lists(_tok, max_size=6), "token_logprobs": st.lists(_num, max_size=6),
                  "top_logprobs": st.lists(_top, max_size=6), "content": st.lists(_json, max_size=3)},
)  # fmt: skip
_vllm_entry = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(["1", "2", "3", "x"]),
        st.fixed_dictionaries({}, optional={"logprob": _num, "rank": _num, "decoded_token": _tok}),
        max_size=3,
    ),
)
_sglang_row = st.lists(st.one_of(_num, _tok), max_size=3)
SHAPES = {
    "/v1/models": st.fixed_dictionaries(
        {"data": st.lists(st.fixed_dictionaries({}, optional={"id": _tok, "max_model_len": _num}), max_size=2)}
    ),
    "/tokenize": st.fixed_dictionaries(
        {}, optional={"tokens": st.lists(_tok, max_size=6), "count": _num, "max_model_len": _num}
    ),
    "/v1/chat/completions": st.fixed_dictionaries(
        {"choices": st.lists(
            st.fixed_dictionaries({}, optional={"message": st.fixed_dictionaries({}, optional={"content": _leaf}),
                                                "finish_reason": _leaf}), max_size=2)},
        optional={"usage": _usage},
    ),
    "/v1/completions": st.fixed_dictionaries(
        {"choices": st.lists(st.fixed_dictionaries({}, optional={"text": _leaf, "logprobs": _logprobs}), max_size=2)},
        optional={"usage": _usage, "prompt_logprobs": st.lists(_vllm_entry, max_size=6)},
    ),
    "/generate": st.fixed_dictionaries(
        {"meta_info": st.fixed_dictionaries(
            {}, optional={"input_token_logprobs": st.lists(_sglang_row, max_size=6),
                          "input_top_logprobs": st.lists(st.one_of(st.none(), st.lists(_sglang_row, max_size=3)),
                                                         max_size=6)})},
    ),
}  # fmt: skip


def _answer(path: str) -> st.SearchStrategy[tuple[int, str]]:
    body = st.one_of(
        SHAPES[path].map(json.dumps),
        SHAPES[path].map(json.dumps),
        _json.map(json.dumps),
        st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    )
    return st.tuples(st.sampled_from([200, 200, 200, 200, 400, 404, 422, 500]), body)


ENDPOINTS = ["/v1/models", "/tokenize", "/v1/chat/completions", "/v1/completions", "/generate"]
MESSAGES = [{"role": "user", "content": "Where is the key?"}]


async def _every_call(backend: Any) -> None:
    async def attempt(call: Callable[[], Any]) -> None:
        try:
            await call()
        except SpeedtrapError as exc:
            assert "\n" not in exc.one_line()

    await attempt(backend.connect)
    await attempt(lambda: backend.count_tokens(MESSAGES))
    await attempt(lambda: backend.render(MESSAGES))
    await attempt(lambda: backend.prompt_logprobs([1, 2, 3, 4], 3))
    await attempt(lambda: backend.prompt_logprobs("user: where is the key?", 3))
    await attempt(lambda: backend.decode_logprobs([1, 2, 3], 2, 3))
    await attempt(lambda: backend.chat(MESSAGES, 4))


_MODELS_OK = (200, '{"data": [{"id": "m"}]}')


@FUZZ
@example({"/v1/models": _MODELS_OK, "/tokenize": (200, '{"tokens": ["w1", null]}')}, "openai")  # fixed: ValueError
@example({"/v1/models": _MODELS_OK, "/tokenize": (200, '{"count": [1, 2]}')}, "vllm")  # fixed: KeyError
@given(
    st.fixed_dictionaries({path: _answer(path) for path in ENDPOINTS}), st.sampled_from(["openai", "vllm", "sglang"])
)
def test_server_answers_fail_in_one_line(
    fuzz_cases: Counter[str], answers: dict[str, tuple[int, str]], api: str
) -> None:
    from speedtrap.probe import HttpBackend

    def handler(request: httpx.Request) -> httpx.Response:
        status, body = answers.get(request.url.path, (404, "{}"))
        return httpx.Response(status, content=body.encode("utf-8", "surrogatepass"))

    backend = HttpBackend(
        "http://server.test",
        "",
        retries=0,
        backoff=0.0,
        api=api,
        transport=httpx.MockTransport(handler),  # type: ignore[arg-type]
    )
    asyncio.run(_every_call(backend))
    fuzz_cases["server answers (HTTP backend, 7 calls each)"] += 1


# ----------------------------------------------------------------------------------------------
# Input files: the hook for formats that come later.


def _load_isolate(path: Path) -> object:
    from speedtrap.manifest import load_manifest

    return load_manifest(path)


def _load_triage(path: Path) -> object:
    from speedtrap.triage import from_diff_files

    return from_diff_files([path], None).close()


def _load_recording(path: Path) -> object:
    from speedtrap.probe import read_recording

    return read_recording(path)


def _load_floor(path: Path) -> object:
    from speedtrap.probe import load_floor

    return load_floor(path)


FILE_LOADERS: list[tuple[str, Callable[[Path], object]]] = [
    ("isolate manifest", _load_isolate),
    ("diff file", _load_triage),
    ("recording", _load_recording),
    ("noise floor", _load_floor),
]


@FUZZ
@given(st.sampled_from(FILE_LOADERS), st.one_of(st.binary(max_size=300), _json.map(json.dumps), _document, _diff))
def test_input_files_fail_in_one_line(
    fuzz_cases: Counter[str], loader: tuple[str, Callable[[Path], object]], text: str | bytes
) -> None:
    _, load = loader
    with _written(text, "input") as path:
        _typed(lambda: load(path))
    fuzz_cases[f"input files ({len(FILE_LOADERS)} loaders)"] += 1
