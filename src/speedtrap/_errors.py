"""The exception tree, in one place.

Every error a user can cause is a :class:`SpeedtrapError` carrying a one-line message that names
the problem and the fix; the CLI prints that line and exits with code 2, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class SpeedtrapError(Exception):
    """Base of every error speedtrap raises on purpose.

    Fields, never attributes set later: ``problem`` and ``fix`` make the one line; ``code`` is a
    machine-readable reason (``context_length_exceeded``) that callers test instead of the text;
    ``log`` is the log file that explains it (a server's output), kept by the trial record.
    """

    exit_code = 2

    def __init__(
        self, problem: str, fix: str | None = None, *, code: str | None = None, log: Path | None = None
    ) -> None:
        self.problem = problem
        self.fix = fix
        self.code = code
        self.log = log
        super().__init__(self.one_line())

    def with_log(self, log: Path) -> SpeedtrapError:
        """The same error, naming the log that explains it."""
        self.log = log
        return self

    def one_line(self) -> str:
        return f"{self.problem} (fix: {self.fix})" if self.fix else self.problem


class UsageError(SpeedtrapError):
    """Bad input from the user: an unknown name, a malformed value, a missing file."""


class TargetError(SpeedtrapError):
    """A target cannot be built or loaded (model file missing or corrupt, unknown model type)."""


class PatchError(SpeedtrapError):
    """A patch is unknown, fails to apply, or raises while the model runs."""


class ProbeError(SpeedtrapError):
    """A probe cannot produce an honest measurement (truncated prompt, misaligned logprobs)."""


class ServerError(SpeedtrapError):
    """A server is unreachable, unhealthy, or answers garbage."""


class ManifestError(SpeedtrapError):
    """A manifest file is invalid; the message names the field."""


class StoreError(SpeedtrapError):
    """A trial store or run directory cannot be read or written."""
