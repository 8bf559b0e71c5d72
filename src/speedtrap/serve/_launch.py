"""Loading a target for serving: config overrides, patches switched on by their gates, then uvicorn."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from speedtrap._errors import UsageError
from speedtrap.targets import InProcessModel, load_target, patches_switched_on
from speedtrap.targets import parse_overrides as parse_overrides  # serve's --set is the targets' one


def load_for_serving(
    target: str, overrides: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> InProcessModel:
    """The target loaded with its config overrides and the patches whose gates are on, as a server would."""
    model = load_target(target, overrides)
    model.set_patches(patches_switched_on(model, environ))
    return model


def serve(
    target: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    overrides: Mapping[str, str] | None = None,
    model_name: str | None = None,
    prefix_cache: int = 8,
    threads: int | None = None,
    *,
    dialect: str = "vllm",
    context: int | None = None,
    allow_auto_truncate: bool = False,
    stale_prompt_cache: bool = False,
) -> None:
    """Load, print the patches that are on (one line on stderr), and serve until interrupted.

    The constructed stale-prompt-cache bug is on with ``stale_prompt_cache`` or its env var.
    """
    from speedtrap.serve._stale import ENV, stale_cache_on

    stale = stale_prompt_cache or stale_cache_on(os.environ)
    import uvicorn

    if dialect not in {"vllm", "sglang"}:
        raise UsageError(f"unknown --dialect {dialect!r}", "choose vllm or sglang")
    if allow_auto_truncate and dialect != "sglang":
        raise UsageError("--allow-auto-truncate is SGLang's flag", "add --dialect sglang")
    if context is not None and context < 16:
        raise UsageError(f"--context-length {context} is too small", "pass 16 or more")

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    model = load_for_serving(target, overrides)
    from speedtrap.serve._app import create_app

    app = create_app(
        model,
        model_name=model_name,
        prefix_cache=prefix_cache,
        dialect="sglang" if dialect == "sglang" else "vllm",
        context=context,
        allow_auto_truncate=allow_auto_truncate,
        stale_prompt_cache=stale,
    )
    print(f"speedtrap serve: patches on: {', '.join(model.active) or 'none'}", file=sys.stderr, flush=True)
    if stale:
        print(f"speedtrap serve: stale prompt cache on ({ENV}): a constructed bug", file=sys.stderr, flush=True)
    print(f"speedtrap serve: {model_name or model.name} on http://{host}:{port}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
