"""The command line's shared options, declared once (each command imports the ones it takes)."""

from __future__ import annotations

from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
# The target a probe, record or check measures (in-process by name, or a server by URL).
TargetOpt = Annotated[
    str,
    typer.Option("--target", "-t", help="smol-moe, hf:<model type | dir | file.gguf>, or a server's http(s):// URL."),
]
PatchesOpt = Annotated[
    str | None,
    typer.Option(
        "--patches",
        "-p",
        help="Comma-separated patch names or user patches (module:function, file.py:function); "
        "default: those whose gate is on in the environment.",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="In-process config override KEY=VALUE (repeatable), e.g. routed_scaling_factor=1.5."),
]
ModelOpt = Annotated[str, typer.Option("--model", help="The model name on the server (default: its first).")]
LengthsOpt = Annotated[str | None, typer.Option("--lengths", help="Prompt lengths in tokens, e.g. 256,512,1024.")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Seed of the planted values and filler order.")]
ConcurrencyOpt = Annotated[int, typer.Option("--concurrency", help="HTTP requests in flight.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for one HTTP answer.")]
RetriesOpt = Annotated[int, typer.Option("--retries", help="HTTP retries (connection errors, 5xx, timeouts).")]
QuickOpt = Annotated[bool, typer.Option("--quick", help="Start from the quick preset (a CI-sized grid).")]
ApiOpt = Annotated[str, typer.Option("--api", help="Prompt-logprob dialect: openai, vllm or sglang.")]
