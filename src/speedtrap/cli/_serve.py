"""``speedtrap serve``: an OpenAI-compatible server for an in-process target."""

from __future__ import annotations

from typing import Annotated

import typer

from speedtrap.cli._app import app, user_errors
from speedtrap.cli._options import SetOpt


@app.command("serve")
@user_errors
def serve_cmd(
    target: Annotated[str, typer.Option("--target", "-t", help="The in-process target to serve.")] = "smol-moe",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    host: Annotated[str, typer.Option("--host", help="Listen address (loopback by default).")] = "127.0.0.1",
    set_: SetOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="The model name to serve (default: the target's).")] = None,
    prefix_cache: Annotated[int, typer.Option("--prefix-cache", help="Conversation prefixes kept cached.")] = 8,
    threads: Annotated[int | None, typer.Option("--threads", help="torch intra-op threads (default: torch's).")] = None,
    dialect: Annotated[
        str, typer.Option("--dialect", help="vllm, or sglang: answer as SGLang 0.5.23 does (drops vLLM-only flags).")
    ] = "vllm",
    context_length: Annotated[
        int | None, typer.Option("--context-length", help="The context in tokens (default: the target's).")
    ] = None,
    allow_auto_truncate: Annotated[
        bool, typer.Option("--allow-auto-truncate", help="SGLang's: cut prompts longer than the context silently.")
    ] = False,
    stale_prompt_cache: Annotated[
        bool,
        typer.Option(
            "--stale-prompt-cache",
            help="A constructed bug: a repeated prompt's logprobs come from stale KV "
            "(also SPEEDTRAP_SERVE_STALE_PROMPT_CACHE=1).",
        ),
    ] = False,
) -> None:
    """Serve a target over HTTP; patches are switched on by their env vars (and --set config keys) at launch."""
    from speedtrap.serve import parse_overrides, serve

    serve(
        target, host, port, parse_overrides(set_ or []), name, prefix_cache, threads,
        dialect=dialect, context=context_length, allow_auto_truncate=allow_auto_truncate,
        stale_prompt_cache=stale_prompt_cache,
    )  # fmt: skip
