"""The divergence baseline of an isolate run: a recording (made once, or given) instead of a live server.

Recorded mode (the default for servers): before any trial, the baseline configuration is launched,
its answers recorded into ``RUN_DIR/reference.strec``, and the server stopped; every trial then
compares its own server with the recording, so at most one server of the stack is up at a time. A
run resumed in the same directory reuses a complete recording (and finishes an interrupted one).
``reference = "live"`` keeps a reference server up beside the trials; a path names a recording
made earlier (``speedtrap record``), for servers and in-process targets alike.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError, ServerError, UsageError
from speedtrap.manifest import ProbeSpec
from speedtrap.stack import Server

RECORDING_NAME = "reference.strec"


def uses_recording(probe: ProbeSpec) -> bool:
    return probe.kind == "divergence" and probe.reference != "live"


def expected_settings(probe: ProbeSpec) -> Any:
    """The divergence settings a recording must hold for this probe (repeats re-measure the same sequences)."""
    return probe.probe_settings(0)


def check_settings(probe: ProbeSpec, recording: Any) -> None:
    from speedtrap import probe as probe_pkg

    try:
        probe_pkg.resolve_settings(recording, "divergence", expected_settings(probe))
    except UsageError as exc:  # names the field that differs: the manifest or the recording must change
        raise ManifestError(f"probe.reference: {exc.problem}", exc.fix) from None


def load_file(probe: ProbeSpec) -> Any:
    """The recording a manifest names (checked against its probe settings)."""
    from speedtrap import probe as probe_pkg

    path = probe.reference_file
    assert path is not None
    recording = probe_pkg.read_recording(path)
    check_settings(probe, recording)
    return recording


def load_matching(probe: ProbeSpec, path: Path) -> Any:
    """The complete recording at ``path`` when it holds this probe's settings, else None (nothing recorded)."""
    from speedtrap import probe as probe_pkg

    if not path.is_file():
        return None
    try:
        recording = probe_pkg.read_recording(path)
        check_settings(probe, recording)
    except (probe_pkg.RecordingError, ManifestError):
        return None
    return recording


def from_bytes(data: bytes, where: str) -> Any:
    from speedtrap import probe as probe_pkg

    return probe_pkg.Recording.from_bytes(data, where)


def record_server(oracle: Any, run_dir: Path | None) -> Any:
    """Launch the baseline configuration, record it, stop it; reuse a complete recording in ``run_dir``."""
    from speedtrap import probe as probe_pkg

    folder = run_dir if run_dir is not None else Path(tempfile.mkdtemp(prefix="speedtrap-reference-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RECORDING_NAME
    settings = expected_settings(oracle.probe)
    if path.exists():
        try:
            recording = probe_pkg.read_recording(path)
            check_settings(oracle.probe, recording)
            return recording
        except (probe_pkg.RecordingError, ManifestError):
            pass  # incomplete (finished below with resume) or made for other settings (recorded again)
    log = folder / "reference.log"
    server: Server
    server, _ = oracle._start((), log)
    oracle.recording_launches += 1
    with server:

        async def go(resume: bool) -> Any:
            # the trials' api (e.g. SGLang's /generate, keyed by token id): a recording of the OpenAI endpoints
            # names tokens by text, and a trial keyed by id could not be compared with it
            backend = oracle.backend(server)
            try:
                return await probe_pkg.arecord(
                    backend, path, divergence=settings, resume=resume, progress=False, target="baseline configuration"
                )
            finally:
                await backend.aclose()

        try:
            if path.exists():
                try:
                    return asyncio.run(go(True))  # finish an interrupted recording of the same settings
                except (UsageError, probe_pkg.RecordingError):
                    path.unlink()  # another run's or a damaged one: record afresh
            return asyncio.run(go(False))
        except ServerError:
            died = server.died()
            if died is not None:
                raise died from None
            raise
