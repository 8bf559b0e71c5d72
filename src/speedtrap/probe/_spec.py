"""The probe package's settings from the spec's typed ``Probe`` (``speedtrap.spec``): preset, then the
probe's own fields; a repeat shifts the seed. One place turns a spec probe into settings."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from speedtrap._errors import UsageError
from speedtrap.probe._divergence import DivergenceSettings
from speedtrap.probe._recall import RecallSettings
from speedtrap.probe._repeat import RepeatSettings

if TYPE_CHECKING:
    from speedtrap.spec import DivergenceProbe, RecallProbe, RepeatProbe

ProbeSettings = DivergenceSettings | RecallSettings | RepeatSettings
_CLASSES: dict[str, type[DivergenceSettings] | type[RecallSettings] | type[RepeatSettings]] = {
    "divergence": DivergenceSettings,
    "recall": RecallSettings,
    "repeat": RepeatSettings,
}


def settings_for(probe: DivergenceProbe | RecallProbe | RepeatProbe, repeat: int = 0) -> ProbeSettings:
    """The settings object of ``probe``'s kind: its preset (``quick`` or the defaults), then its
    ``settings`` fields; ``repeat`` > 0 shifts the seed (a repeated trial sees other sequences).
    A field the settings class lacks, or a value it refuses, is one line naming it."""
    cls = _CLASSES[probe.kind]
    settings: ProbeSettings = cls.quick() if probe.preset == "quick" else cls()
    names = {f.name for f in dataclasses.fields(settings)}
    for key in probe.settings:
        if key not in names:
            raise UsageError(
                f"probe.settings.{key} is not a field of {cls.__name__}", f"use: {', '.join(sorted(names))}"
            )
    values: dict[str, Any] = dict(probe.settings)
    if repeat and "seed" in names:
        values["seed"] = int(values.get("seed", getattr(settings, "seed", 0))) + repeat
    try:
        return dataclasses.replace(settings, **values)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"probe.settings: {exc}", "check the field types") from None
