"""What every stage of a pipeline run shares: the run directory, the source, the settings, the lazily
loaded model, progress callbacks, and reuse of stored parts by key."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._errors import SpeedtrapError
from speedtrap.pipeline._settings import PipelineSettings, stable_key
from speedtrap.progress import Progress
from speedtrap.report import Part, RunRecord, Source, load_part, save_part

if TYPE_CHECKING:
    from speedtrap.manifest import Manifest
    from speedtrap.targets import InProcessModel


@dataclass
class Context:
    run_dir: Path
    source: Source
    settings: PipelineSettings
    record: RunRecord
    progress: Progress
    model: InProcessModel | None = None  # loaded on first use (a fully reused run never loads it)
    manifest: Manifest | None = None  # a --manifest run's
    reused: list[str] = field(default_factory=list)  # parts taken from an earlier run
    computed: list[str] = field(default_factory=list)
    recall_reference: Any = None  # a sequential recall's baseline (probe.RecallReference), shared by its candidates

    def save_record(self) -> None:
        self.record.save(self.run_dir)

    def in_process_model(self) -> InProcessModel:
        if self.model is None:
            from speedtrap.targets import load_target

            overrides = dict(self.settings.overrides) or None
            self.model = load_target(str(self.source.target), overrides, self.settings.patches or ())
        return self.model

    def server_manifest(self) -> Manifest:
        """The manifest of a ``--manifest`` run (read before any stage runs)."""
        if self.manifest is None:
            raise SpeedtrapError("this run has no manifest", "pass --manifest speedtrap.toml")
        return self.manifest

    def base_key(self) -> dict[str, Any]:
        """What every measured part depends on besides its own configuration."""
        return {
            "source": self.source.to_json(),
            "manifest_spec": self.manifest.to_json() if self.manifest is not None else None,
            "overrides": dict(self.settings.overrides),
        }

    def stored(self, path: Path, key: str) -> Part | None:
        """The part at ``path`` if an earlier run stored it with the same key."""
        try:
            part = load_part(path)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return part if part.key == key else None

    def part(self, path: Path, key_parts: tuple[Any, ...], make: Callable[[str], Part]) -> Part:
        """Reuse the part at ``path`` when its key matches, or make it, store it and return it."""
        key = stable_key(self.base_key(), *key_parts)
        found = self.stored(path, key)
        if found is not None:
            self.reused.append(str(path.relative_to(self.run_dir)))
            return found
        t0 = time.perf_counter()
        part = make(key)
        part = Part(
            part.stage, part.result, part.label, part.role, part.patches, part.command,
            round(time.perf_counter() - t0, 3), part.extra, key,
        )  # fmt: skip
        save_part(path, part)
        self.computed.append(str(path.relative_to(self.run_dir)))
        return part
