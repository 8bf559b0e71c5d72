"""Probe command for a vLLM server: the mean negative log-likelihood of a fixed English passage.

``python vllm_nll_probe.py BASE_URL MODEL`` asks ``/v1/completions`` for the prompt's own logprobs
(vLLM's ``prompt_logprobs``) and prints ``{"nll": mean over the prompt's tokens, "tokens": n}``.
A model whose MLP output is scaled twice reads ordinary English as noise: its NLL jumps.
"""

from __future__ import annotations

import json
import sys
import urllib.request

TEXT = (
    "The city library opens at nine in the morning and closes at six in the evening. On Saturdays it "
    "opens later, at ten, and on Sundays it stays closed. Children can borrow up to five books at a "
    "time, and adults can borrow up to ten. Books must be returned within three weeks."
)


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    body = {"model": model, "prompt": TEXT, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    request = urllib.request.Request(
        f"{base_url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        data = json.load(response)
    entries = data["choices"][0]["prompt_logprobs"]
    # prompt_logprobs = 0: each entry holds the prompt token's own logprob only (the first is None).
    logprobs = [float(next(iter(e.values()))["logprob"]) for e in entries[1:] if e]
    if len(logprobs) != len(entries) - 1:
        sys.exit("a prompt_logprobs entry is empty")
    print(json.dumps({"nll": -sum(logprobs) / len(logprobs), "tokens": len(logprobs)}))


if __name__ == "__main__":
    main()
