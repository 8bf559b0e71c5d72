"""Secrets never leave the process: the one rule for what looks secret, and how it is hidden.

Used by ``inspect`` (a live server's argv and environment), by the command lines and target
identities written into run directories, and by the CI gate's JUnit file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "<redacted>"
# A name looks secret when one of its parts (split at _ - .) is a secret word: TOKEN, API_KEY, SECRET,
# PASSWORD/PASSWD/PWD, CREDENTIALS, AUTH..., COOKIE, SESSION. Whole parts, so TOKENIZERS_PARALLELISM,
# GIT_AUTHOR_NAME and the working directories PWD and OLDPWD are not secrets.
_SECRET_PART = re.compile(
    r"^(.*(password|passwd|secret|credential|creds).*|.*(token|apikey)|tokens|keys?|auth(token|orization|z)?"
    r"|oauth.*|cookies?|session(id)?|pwd|pass|signature|sig|private)$"
)
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})
# A count of tokens (``--max-total-tokens``, ``--max-num-batched-tokens``, ``MAX_NEW_TOKENS``) is a serving
# setting, not a secret: ``tokens`` beside one of these words is a quantity.
_QUANTITY = frozenset({"max", "min", "num", "total", "batched", "new", "prefill", "chunked", "prompt", "output"})


def secret_name(name: str) -> bool:
    """Whether an environment variable or option name looks like it holds a secret."""
    name = name.strip().lstrip("-")
    if name.upper() in _NOT_SECRET:
        return False
    parts = [part for part in re.split(r"[_\-.]+", name.lower()) if part]
    counted = not _QUANTITY.isdisjoint(parts)
    return any(_SECRET_PART.match(part) and not (counted and part == "tokens") for part in parts)


_SECRET_VALUE = re.compile(
    r"^(hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_-]{8,}|gh[pousr]_[A-Za-z0-9]{8,}|github_pat_|"
    r"xox[abprs]-|AKIA[0-9A-Z]{12,}|ASIA[0-9A-Z]{12,}|glpat-|eyJ[A-Za-z0-9_-]{10,}\.)"
)
_URL_CREDS = re.compile(r"(://[^/\s:@]+:)[^@\s/]+@")


def is_secret(name: str, value: str) -> bool:
    return secret_name(name) or bool(_SECRET_VALUE.match(value.strip()))


def redact_env(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    out, hidden = {}, []
    for k, v in env.items():
        if is_secret(k, v):
            out[k] = REDACTED
            hidden.append(k)
        else:
            out[k] = _URL_CREDS.sub(r"\1" + REDACTED + "@", v)
    return out, sorted(hidden)


def redact_argv(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and "=" in arg:
            name, value = arg.split("=", 1)
            out.append(
                f"{name}={REDACTED}"
                if is_secret(name.lstrip("-"), value)
                else _URL_CREDS.sub(r"\1" + REDACTED + "@", arg)
            )
            continue
        if arg.startswith("-") and secret_name(arg):
            hide_next = True
        out.append(REDACTED if _SECRET_VALUE.match(arg) else _URL_CREDS.sub(r"\1" + REDACTED + "@", arg))
    return out


def redact_url(text: str) -> str:
    """``text`` with the password of any ``scheme://user:password@host`` replaced."""
    return _URL_CREDS.sub(r"\1" + REDACTED + "@", text)
