"""Launch lines read off running processes, made reusable: ports and the model path become placeholders,
the engine's speed switches are taken out into patches.

Pure functions over argument lists (no process is read here): ``speedtrap init --pid`` calls them per role.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from speedtrap._redact import is_secret, secret_name

_URL_PORT = re.compile(r"(?<=:)([0-9]{1,5})(?=/|$)")
_PORT_FLAG = re.compile(r"^--([a-z0-9-]*-)?port$")

# An engine's speed switches (flag -> how many values it takes): set in a running launch, each one becomes a
# candidate patch (off: the engine's default). Every other flag stays in the base launch as it ran.
SWITCH_FLAGS: dict[str, dict[str, int]] = {
    "sglang": {
        "--chunked-prefill-size": 1,
        "--disable-radix-cache": 0,
        "--enable-torch-compile": 0,
        "--torch-compile-max-bs": 1,
        "--kv-cache-dtype": 1,
        "--quantization": 1,
        "--enable-mixed-chunk": 0,
        "--enable-dp-attention": 0,
        "--enable-two-batch-overlap": 0,
        "--speculative-algorithm": 1,
        "--disable-cuda-graph": 0,
        "--cuda-graph-max-bs": 1,
        "--enable-ep-moe": 0,
        "--enable-deepep-moe": 0,
        "--moe-runner-backend": 1,
        "--enable-hierarchical-cache": 0,
        "--enable-flashinfer-allreduce-fusion": 0,
    },
    "vllm": {
        "--enable-prefix-caching": 0,
        "--max-num-batched-tokens": 1,
        "--kv-cache-dtype": 1,
        "--quantization": 1,
        "--enable-chunked-prefill": 0,
        "--compilation-config": 1,
        "--speculative-config": 1,
        "--no-enforce-eager": 0,
        "--async-scheduling": 0,
    },
    "llama.cpp": {"--flash-attn": 1, "-fa": 1, "--cache-type-k": 1, "-ctk": 1, "--cache-type-v": 1, "-ctv": 1},
    "speedtrap": {"--set": 1, "--stale-prompt-cache": 0},
}
# Engine environment variables known as speed switches (besides SPEEDTRAP_* gates).
SWITCH_ENV = frozenset(
    {
        "SGLANG_ENABLE_TORCH_COMPILE",
        "SGLANG_ENABLE_JIT_DEEPGEMM",
        "SGL_ENABLE_JIT_DEEPGEMM",
        "VLLM_ATTENTION_BACKEND",
        "VLLM_USE_FLASHINFER_SAMPLER",
        "VLLM_FUSED_MOE_CHUNK_SIZE",
        "VLLM_USE_TRITON_FLASH_ATTN",
        "VLLM_MLA_DISABLE",
    }
)
_SETTING_SUFFIXES = ("_DIR", "_VENV", "_MODEL", "_PATH", "_HOME", "_URL", "_KEY", "_TOKEN")
_FALSY = {"", "0", "false", "no", "off"}


def is_number(text: str) -> bool:
    """A plain ASCII number (``str.isdigit`` also takes superscripts and other scripts' digits)."""
    return text.isascii() and text.isdigit()


def is_switch_env(key: str, value: str) -> bool:
    """A variable that switches a patch on: a ``SPEEDTRAP_*`` gate (not a folder or path setting) or one of the
    engines' known speed variables, set to something other than off."""
    if value.strip().lower() in _FALSY:
        return False
    if key.startswith("SPEEDTRAP_"):
        return not key.endswith(_SETTING_SUFFIXES)
    return key in SWITCH_ENV


@dataclass(frozen=True)
class Switch:
    """One switch found in a launch: a flag with its values, or an environment variable."""

    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        if self.env:
            key, value = self.env[0]
            base = re.sub(r"^SPEEDTRAP_[A-Z0-9]+_", "", key) if key.count("_") > 1 else key
            return _slug(base if value.strip().lower() in {"1", "true", "yes", "on"} else f"{base}_{value}")
        return _slug(" ".join(a for a in self.args if a != "--set"))  # speedtrap serve's --set KEY=VALUE


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60].rstrip("_") or "switch"


def split_switches(engine: str, argv: Sequence[str], start: int) -> tuple[list[str], list[Switch]]:
    """``argv`` without the engine's speed switches (after index ``start``), and those switches in order."""
    known = SWITCH_FLAGS.get(engine, {})
    out, found = list(argv[:start]), []
    i = start
    while i < len(argv):
        a = argv[i]
        name = a.split("=", 1)[0] if a.startswith("--") else a
        if name in known:
            if "=" in a and a.startswith("--"):
                found.append(Switch((a,)))
                i += 1
                continue
            n = known[name]
            values = list(argv[i + 1 : i + 1 + n])
            found.append(Switch((a, *values)))
            i += 1 + n
            continue
        out.append(a)
        i += 1
    return out, found


def drop_secrets(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` without the flags that carry a secret (``--api-key K``, ``--token=T``) nor bare secret values (an
    ``hf_...`` token): a manifest never holds one. Returns the argv and the names of what was left out."""
    out: list[str] = []
    dropped: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a.startswith("-") and "=" in a:
            name, value = a.split("=", 1)
            if is_secret(name.lstrip("-"), value):
                dropped.append(name)
                continue
        elif a.startswith("-") and secret_name(a):
            dropped.append(a)
            skip = True
            continue
        elif is_secret("", a):
            dropped.append("a token-like argument")
            continue
        out.append(a)
    return out, dropped


def port_flags(argv: Sequence[str]) -> list[tuple[str, int]]:
    """The ports a launch names: ``--port N`` as ``port``, ``--X-port N`` as ``X``'s last word (``nccl``,
    ``bootstrap``), in order."""
    out: list[tuple[str, int]] = []
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=")
        if not _PORT_FLAG.match(flag):
            continue
        text = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if not is_number(text):
            continue
        words = flag[2:].split("-")[:-1]
        out.append((words[-1] if words else "port", int(text)))
    return out


def rewrite_argv(argv: Sequence[str], ports: Mapping[int, str], model: str | None) -> list[str]:
    """A launch with ports and the model path as placeholders. A bare number is a port only after a port flag
    (``--port``, ``--nccl-port``) or a URL (the router's ``--prefill URL BOOTSTRAP``)."""
    out: list[str] = []
    for i, a in enumerate(argv):
        prev = argv[i - 1] if i else ""
        portish = bool(_PORT_FLAG.match(prev)) or "://" in prev
        out.append(rewrite(a, ports, model, bare=portish))
    return out


def rewrite(text: str, ports: Mapping[int, str], model: str | None, bare: bool = True) -> str:
    """One argument (or env value) with ports and the model path as placeholders: a whole argument equal to the
    model path or (``bare``) to a port number, a ``--flag=`` value, or a URL's ``:PORT``."""
    if model is not None and text == model:
        return "{model}"
    if bare and is_number(text) and int(text) in ports:
        return "{" + ports[int(text)] + "}"
    if text.startswith("-") and "=" in text:
        flag, value = text.split("=", 1)
        return f"{flag}={rewrite(value, ports, model, bare=bool(_PORT_FLAG.match(flag)))}"
    if "://" in text or ":" in text:

        def sub(m: re.Match[str]) -> str:
            n = int(m.group(1))
            return "{" + ports[n] + "}" if n in ports else m.group(1)

        out = _URL_PORT.sub(sub, text)
        if model is not None and model in out and len(model) > 1 and "/" in model:
            out = out.replace(model, "{model}")
        return out
    return text


__all__ = [
    "SWITCH_ENV",
    "SWITCH_FLAGS",
    "Switch",
    "drop_secrets",
    "is_number",
    "is_switch_env",
    "port_flags",
    "rewrite",
    "rewrite_argv",
    "split_switches",
]
