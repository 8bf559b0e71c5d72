"""The trial store: one SQLite file per run directory, one committed row per finished trial.

A trial is found again by its key: a hash of the target's identity, the probe's settings, the
configuration and the repeat number. The verdict rule is not part of the key: a trial's figures
do not depend on it, so a run with another bound re-judges stored figures instead of relaunching.
Rows are only appended; a failed trial is kept (with its log) but never reused, so ``--resume``
retries it. A lock file keeps two processes from running in one directory at once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from speedtrap._errors import StoreError
from speedtrap.isolate._results import Config, Outcome, Trial

DB_NAME = "trials.sqlite"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    identity TEXT NOT NULL,
    spec TEXT NOT NULL,
    status TEXT NOT NULL,
    started REAL NOT NULL,
    finished REAL,
    result TEXT
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    config TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    status TEXT NOT NULL,
    outcome TEXT,
    figures TEXT NOT NULL,
    error TEXT,
    log_path TEXT,
    report_path TEXT,
    attempts INTEGER NOT NULL,
    started REAL NOT NULL,
    finished REAL NOT NULL,
    launch_s REAL NOT NULL,
    probe_s REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS trials_key ON trials (key, status);
"""


def stable_hash(obj: Any) -> str:
    """SHA-256 of a JSON document with sorted keys."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def trial_key(identity: Any, config: Config, repeat: int) -> str:
    return stable_hash({"identity": identity, "config": sorted(config), "repeat": repeat})


class TrialStore:
    """Trials of the runs in one directory (``None``: in memory, for simulated oracles)."""

    def __init__(self, run_dir: Path | None) -> None:
        self.run_dir = run_dir
        self._lock: IO[str] | None = None
        if run_dir is None:
            self.path: str = ":memory:"
        else:
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the run directory {run_dir}: {exc}", "choose another --run-dir"
                ) from None
            self._take_lock(run_dir)
            self.path = str(run_dir / DB_NAME)
        try:
            self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            if run_dir is not None:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
            row = self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise StoreError(
                    f"the trial store {self.path} has schema {row[0]}, this speedtrap reads {SCHEMA_VERSION}",
                    "use a new --run-dir",
                )
        except sqlite3.DatabaseError as exc:
            self._release()
            raise StoreError(f"the trial store {self.path} cannot be read: {exc}", "use a new --run-dir") from None

    def _take_lock(self, run_dir: Path) -> None:
        lock = open(run_dir / ".lock", "a+")  # noqa: SIM115  (held for the store's lifetime)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise StoreError(
                f"another speedtrap process is running in {run_dir}", "wait for it, or choose another --run-dir"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock = lock

    def _release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def close(self) -> None:
        self.db.close()
        self._release()

    def __enter__(self) -> TrialStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------
    # Runs.

    def begin_run(self, identity: Any, spec: Any, resume: bool) -> tuple[int, bool]:
        """A run id, and whether it continues an interrupted run.

        Without ``resume`` an interrupted run in this directory is an error (say what to do); with
        it, the latest interrupted run with the same identity continues. Either way finished trials
        with matching keys are reused.
        """
        ident = stable_hash(identity)
        row = self.db.execute(
            "SELECT id, identity, started FROM runs WHERE status = 'running' ORDER BY id DESC"
        ).fetchone()
        if row is not None:
            run_id, other, started = int(row[0]), str(row[1]), float(row[2])
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
            if not resume:
                raise StoreError(
                    f"{self.run_dir} holds an interrupted run (started {when})",
                    "pass --resume to continue it, or choose another --run-dir",
                )
            if other == ident:
                return run_id, True
            self.db.execute("UPDATE runs SET status = 'abandoned' WHERE id = ?", (run_id,))
        cur = self.db.execute(
            "INSERT INTO runs (identity, spec, status, started) VALUES (?, ?, 'running', ?)",
            (ident, json.dumps(spec, default=str), time.time()),
        )
        return int(cur.lastrowid or 0), False

    def finish_run(self, run_id: int, status: str, result: Any) -> None:
        self.db.execute(
            "UPDATE runs SET status = ?, finished = ?, result = ? WHERE id = ?",
            (status, time.time(), json.dumps(result, default=str), run_id),
        )

    def run_status(self, run_id: int) -> str | None:
        row = self.db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        return str(row[0]) if row else None

    # ------------------------------------------------------------------------------------------
    # Trials.

    def lookup(self, key: str) -> Trial | None:
        """The latest finished (status ok) trial with this key, marked as reused."""
        row = self.db.execute(
            f"SELECT {_COLUMNS} FROM trials WHERE key = ? AND status = 'ok' ORDER BY id DESC LIMIT 1", (key,)
        ).fetchone()
        return _trial(row, reused=True) if row else None

    def record(self, key: str, run_id: int, trial: Trial) -> Trial:
        """Append one finished trial and commit it; returns it with its store index."""
        cur = self.db.execute(
            "INSERT INTO trials (key, run_id, config, repeat, status, outcome, figures, error, log_path, report_path,"
            " attempts, started, finished, launch_s, probe_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key,
                run_id,
                json.dumps(list(trial.config)),
                trial.repeat,
                trial.status,
                trial.outcome.value if trial.outcome else None,
                json.dumps(trial.figures),
                trial.error,
                trial.log_path,
                trial.report_path,
                trial.attempts,
                trial.started,
                trial.finished,
                trial.launch_s,
                trial.probe_s,
            ),
        )
        index = int(cur.lastrowid or 0)
        stored = _trial(self.db.execute(f"SELECT {_COLUMNS} FROM trials WHERE id = ?", (index,)).fetchone(), False)
        return dataclasses.replace(stored, stopped=trial.stopped)  # not a column: this run's notes say it

    def trials(self, run_id: int | None = None) -> list[Trial]:
        sql = f"SELECT {_COLUMNS} FROM trials" + (" WHERE run_id = ?" if run_id is not None else "") + " ORDER BY id"
        return [_trial(r, False) for r in self.db.execute(sql, () if run_id is None else (run_id,))]

    def next_index(self) -> int:
        row = self.db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM trials").fetchone()
        return int(row[0])


def stored_trials(run_dir: Path) -> list[Trial]:
    """The trials an isolate run directory holds, oldest first, read-only (no lock, nothing written):
    how the other stages read a search, finished or killed half-way. A missing store is no trials;
    an unreadable one is a :class:`StoreError`."""
    db = Path(run_dir) / DB_NAME
    if not db.exists():
        return []
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)
        try:
            rows = con.execute(f"SELECT {_COLUMNS} FROM trials ORDER BY id").fetchall()
        finally:
            con.close()
        return [_trial(r, False) for r in rows]
    except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{db} is unreadable ({exc})", "rerun the search with --resume, or delete the file") from None


_COLUMNS = (
    "id, run_id, config, repeat, status, outcome, figures, error, log_path, report_path, attempts,"
    " started, finished, launch_s, probe_s"
)


def _trial(row: Any, reused: bool) -> Trial:
    (index, run_id, config, repeat, status, outcome, figures, error, log_path, report_path, attempts) = row[:11]
    started, finished, launch_s, probe_s = row[11:]
    return Trial(
        index=int(index),
        config=tuple(json.loads(config)),
        repeat=int(repeat),
        status=str(status),
        outcome=Outcome(outcome) if outcome else None,
        figures={str(k): float(v) for k, v in json.loads(figures).items()},
        error=error,
        log_path=log_path,
        report_path=report_path,
        attempts=int(attempts),
        started=float(started),
        finished=float(finished),
        launch_s=float(launch_s),
        probe_s=float(probe_s),
        run_id=int(run_id),
        reused=reused,
    )
