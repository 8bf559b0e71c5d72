"""The probe a manifest or a command line asks for: a union tagged on ``kind``.

The settings of each kind are the fields of its settings class in ``speedtrap.probe``
(``DivergenceSettings``, ``RecallSettings``, ``RepeatSettings``), checked there when the probe
is built; here they are a table of numbers, flags and lists.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from speedtrap._errors import UsageError

SettingValue = int | float | bool | str | list[int] | list[float]
Api = Literal["openai", "vllm", "sglang"]  # the prompt-logprob dialect of a server


class _Probe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: Literal["quick", "default"] | None = Field("quick", description="Start from this preset of settings.")
    settings: dict[str, SettingValue] = Field(
        default_factory=dict, description="Fields of the kind's settings class, e.g. { lengths = [256] }."
    )
    api: Api = Field("openai", description="Server targets: the prompt-logprob dialect.")
    model: str | None = Field(None, description="Server targets: the model name requests carry.")
    timeout: float = Field(600.0, gt=0, description='Accepted for every kind; read by kind = "command" only.')


class DivergenceProbe(_Probe):
    """Teacher-forced divergence from the baseline, per position, prefill and decode."""

    kind: Literal["divergence"] = "divergence"
    reference: str = Field(
        "recorded",
        description='"recorded" (the baseline recorded once), "live" (a reference server per trial), '
        "or the path of a recording (speedtrap record).",
    )


class RecallProbe(_Probe):
    """Planted-fact recall in long multi-turn conversations."""

    kind: Literal["recall"]


class RepeatProbe(_Probe):
    """The stack's noise floor: identical requests sent again, alone and in a batch (command line only)."""

    kind: Literal["repeat"]


class CommandProbe(BaseModel):
    """Your own evaluation: a command run against each trial's server, printing JSON figures."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["command"]
    argv: list[str] = Field(min_length=1, description='e.g. ["python", "eval.py", "{base_url}"]')
    timeout: float = Field(600.0, gt=0, description="Seconds the command may run.")


Probe = Annotated[DivergenceProbe | RecallProbe | RepeatProbe | CommandProbe, Field(discriminator="kind")]
ManifestProbe = Annotated[DivergenceProbe | RecallProbe | CommandProbe, Field(discriminator="kind")]
PROBE_KINDS = ("divergence", "recall", "repeat", "command")
_PROBE: TypeAdapter[Any] = TypeAdapter(Probe)


def parse_probe(
    raw: dict[str, Any], where: str = "probe"
) -> DivergenceProbe | RecallProbe | RepeatProbe | CommandProbe:
    """A probe from a TOML table, a JSON object or CLI options; a bad key is named with its fix."""
    try:
        probe: DivergenceProbe | RecallProbe | RepeatProbe | CommandProbe = _PROBE.validate_python(
            {"kind": "divergence", **raw}
        )
    except ValidationError as exc:
        raise usage_error(exc, where) from None
    return probe


def usage_error(exc: ValidationError, where: str) -> UsageError:
    """The first of pydantic's errors as one line naming the key, with a fix."""
    err = exc.errors()[0]
    branches = {"int", "float", "bool", "str", "list[int]", "list[float]"}  # a union's branches, not keys
    loc = [str(p) for p in err["loc"] if not str(p).endswith("Probe") and p not in PROBE_KINDS and p not in branches]
    key = ".".join([where, *loc]) if loc else where
    kind = err["type"]
    if kind == "extra_forbidden":
        return UsageError(f"unknown key {key}", "drop it (see the manifest reference)")
    if kind == "union_tag_invalid":
        return UsageError(f"{where}.kind must be one of {', '.join(PROBE_KINDS)}", 'write kind = "divergence"')
    if len(loc) == 2 and loc[0] == "settings":
        return UsageError(f"{key} must be a number, true/false, a string or a list of numbers", "e.g. lengths = [256]")
    return UsageError(f"{key}: {err['msg']}", "see the manifest reference (docs/reference/manifest.md)")
