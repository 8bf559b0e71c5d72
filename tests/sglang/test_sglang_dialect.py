"""``serve --dialect sglang`` against what the real SGLang 0.5.23 server answered (its recorded responses).

The imitation serves smol-moe in process (the same function as the exported folder the real server served),
so token ids, texts and logprobs must agree, not only the shapes. The live check, against a server running
now, is ``test_sglang_live.py::test_the_dialect_answers_as_the_live_server``.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from shapes import REPLAYED, differences, load

from speedtrap.serve import create_app
from speedtrap.targets._base import InProcessModel


@pytest.fixture(scope="module")
def dialect(smol: InProcessModel) -> TestClient:
    smol.set_patches([])
    return TestClient(create_app(smol, dialect="sglang", model_name="MODEL_DIR", context=8192))


def replay(client: TestClient, request: dict[str, Any]) -> Any:
    if request["method"] == "GET":
        return client.get(request["path"]).json()
    return client.post(request["path"], json=request["body"]).json()


@pytest.mark.parametrize("name", REPLAYED)
def test_the_dialect_answers_as_the_recorded_server(dialect: TestClient, name: str) -> None:
    record = load(name)
    problems, _ = differences(record["response"], replay(dialect, record["request"]))
    assert not problems, "\n".join(problems)


def test_the_rules_the_records_show(dialect: TestClient) -> None:
    """The rules one by one, each on the record that shows it."""
    prompt = load("generate_prompt_logprobs")["response"]["meta_info"]
    assert prompt["input_token_logprobs"][0] == [None, 504, None] and prompt["input_top_logprobs"][0] is None
    assert load("generate_decode_logprobs")["response"]["meta_info"]["input_token_logprobs"] == []
    chat = load("chat_completions")
    assert chat["request"]["body"]["model"] == "default" == chat["response"]["model"]  # any name, echoed
    assert replay(dialect, chat["request"])["model"] == "default"
    assert (
        load("tokenize_prompt")["response"]["max_model_len"]
        == 8192
        == load("v1_models")["response"]["data"][0]["max_model_len"]
    )
    assert load("completions_logprobs")["response"]["choices"][0]["logprobs"]["text_offset"] == [-1] * 4


def test_the_comparison_can_fail() -> None:
    """A changed logprob, a changed id, a field the real server lacks: each is named."""
    real = load("generate_prompt_logprobs")["response"]
    changed = {**real, "meta_info": {**real["meta_info"]}}
    changed["meta_info"]["input_token_logprobs"] = [[None, 504, None], [-1.0, 3575, None], *real["meta_info"][
        "input_token_logprobs"][2:]]  # fmt: skip
    changed["output_ids"] = [7043]
    changed["extra"] = 1
    problems, _ = differences(real, changed)
    assert len(problems) == 3, problems
