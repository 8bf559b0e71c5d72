"""speedtrap's in-worker agent: layer captures and the scale check inside a live engine process.

Self-contained (the standard library and torch only): it runs in the engine's own venv, where
speedtrap is not installed. It does nothing unless ``SPEEDTRAP_AGENT_DIR`` is set. It is loaded by
``sitecustomize.py`` beside it (SGLang, ``speedtrap serve``: any Python process with this folder on
``PYTHONPATH``) and by vLLM as the general plugin ``speedtrap_agent`` (the ``.dist-info`` beside it).

It attaches to the loaded model by wrapping the engine's model load (:data:`ATTACH`), then wraps
the root module's ``forward`` on the instance (engines call ``model.forward`` directly). Control is
by files in ``SPEEDTRAP_AGENT_DIR``: the harness writes ``command.json`` atomically; a watcher
thread reads it (``stat`` every 50 ms) and acknowledges it (``<id>.seen``); the model's own thread
picks the command up at the next root forward (a memory check, no I/O). Results are written
atomically under ``results/<id>/`` with a ``done`` marker last (a capture is finished by a
``finish`` command after the request's answer came back: an idle engine runs no forward).

Actions: ``capture`` (every module's output, per position: the fed token id and absolute position,
the full row's sum of squares and max |x|, and a fixed channel sample, float32) and ``scale``
(the units holding ``param`` replayed on the request's first forward at several values; each
unit's routed outputs returned as a Gram matrix, float64).
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .files import write_json
from .provenance import Provenance
from .ranks import complete, declared, rank_world, shard_picks
from .rows import Capture, reduce_for, reduce_rows
from .scale import Scale, assigned, shared_children, unit_of

__all__ = [
    "VERSION", "Provenance", "assigned", "attach", "complete", "install", "reduce_for", "reduce_rows", "register",
    "shard_picks", "shared_children", "unit_of",
]  # fmt: skip

VERSION = "0.1.0"
ENV_DIR = "SPEEDTRAP_AGENT_DIR"
POLL_S = 0.05
# Where each engine builds its model: (module, attribute, holder of ``.model``: the method's
# ``self`` or the function's return value, engine name).
ATTACH = (
    ("sglang.srt.model_executor.model_runner", "ModelRunner.load_model", "self", "sglang"),
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner.load_model", "self", "vllm"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.load_model", "self", "vllm"),
    ("speedtrap.serve._launch", "load_for_serving", "return", "speedtrap"),
)
_WRAPPED = "__speedtrap_agent__"


# -- the agent ----------------------------------------------------------------------------------


class Agent:
    def __init__(self, root: Any, engine: str, folder: Path) -> None:
        self.root = root
        self.engine = engine
        self.folder = folder
        self.lock = threading.RLock()
        self.pending: dict[str, Any] | None = None
        self.capture: Capture | None = None
        self.seen: str | None = None
        self.stamp: tuple[int, int] | None = None
        (folder / "agents").mkdir(parents=True, exist_ok=True)
        rank, world = rank_world()
        info: dict[str, Any] = {"pid": os.getpid(), "engine": engine, "model_class": type(root).__name__,
                                "version": VERSION, "modules": sum(1 for _ in root.named_modules()), "rank": rank,
                                "world": world}  # fmt: skip
        if world > 1:  # each output's layout as its class declares it (read by the SGLang dumper's reduction)
            info["layouts"] = {n: declared(m, world) for n, m in root.named_modules()}
        write_json(folder / "agents" / f"{os.getpid()}.json", info)
        threading.Thread(target=self._watch, name="speedtrap-agent", daemon=True).start()

    def _watch(self) -> None:
        path = self.folder / "command.json"
        while True:
            time.sleep(POLL_S)
            try:
                st = path.stat()
                stamp = (st.st_mtime_ns, st.st_size)
                if stamp == self.stamp:
                    continue
                self.stamp = stamp
                command = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            ident = str(command.get("id", ""))
            if not ident or ident == self.seen:
                continue
            self.seen = ident
            self._handle(command)
            write_json(self.folder / f"{ident}.{os.getpid()}.seen", {"pid": os.getpid()})  # every rank's own
            write_json(self.folder / f"{ident}.seen", {"pid": os.getpid()})

    def _handle(self, command: dict[str, Any]) -> None:
        if command.get("action") == "finish":
            with self.lock:
                capture, self.capture = self.capture, None
                if capture is not None and capture.id == str(command.get("of")):
                    self._finish(capture.id, capture.finish)
                elif capture is not None:
                    capture.close()  # a finish for another capture: this one is dropped
            return
        with self.lock:
            self.pending = command

    def _out(self, ident: str) -> Path:
        out = self.folder / "results" / ident / str(os.getpid())
        out.mkdir(parents=True, exist_ok=True)
        return out

    def _finish(self, ident: str, work: Any) -> None:
        out = self._out(ident)
        try:
            work(out)
            write_json(out / "done", {"ok": True, "files": sorted(p.name for p in out.iterdir())})
        except Exception as exc:  # reported to the harness, never raised into the engine
            write_json(out / "done", {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})

    def forward(self, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.pending is None and self.capture is None:
            return original(*args, **kwargs)
        with self.lock:
            command, self.pending = self.pending, None
            scale = None
            if command is not None and command.get("action") == "capture":
                if self.capture is not None:  # an unfinished capture: its hooks go, its rows are dropped
                    self.capture.close()
                self.capture = Capture(self, command)
            elif command is not None and command.get("action") == "scale":
                try:
                    scale = Scale(self, command)
                except Exception as exc:
                    self._finish(str(command["id"]), lambda _out, exc=exc: _raise(exc))
            if self.capture is not None:
                self.capture.begin(args, kwargs)
            try:
                result = original(*args, **kwargs)
            finally:
                if scale is not None:
                    self._finish(scale.id, scale.replay)
            if self.capture is not None:
                self.capture.layout = None
            return result


def _raise(exc: BaseException) -> None:
    raise exc


_AGENT: Agent | None = None


def attach(holder: Any, engine: str) -> None:
    """Attach to ``holder.model`` (the first model this process loads; a draft model is left alone)."""
    global _AGENT
    root = getattr(holder, "model", None)
    folder = os.environ.get(ENV_DIR)
    if _AGENT is not None or root is None or not folder or not hasattr(root, "named_modules"):
        return
    agent = _AGENT = Agent(root, engine, Path(folder))
    original = root.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return agent.forward(original, args, kwargs)

    root.forward = forward


def _wrap(owner: Any, attr: str, how: str, engine: str) -> None:
    original = getattr(owner, attr, None)
    if original is None or getattr(original, _WRAPPED, False):
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            attach(args[0] if how == "self" else result, engine)
        except Exception as exc:  # never break the engine's model load
            print(f"speedtrap_agent: not attached: {type(exc).__name__}: {exc}", file=sys.stderr)
        return result

    setattr(wrapper, _WRAPPED, True)
    wrapper.__name__ = getattr(original, "__name__", attr)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    setattr(owner, attr, wrapper)


def _patch(module: Any) -> None:
    for name, path, how, engine in ATTACH:
        if module.__name__ != name:
            continue
        *owners, attr = path.split(".")
        owner = module
        for part in owners:
            owner = getattr(owner, part, None)
        if owner is not None:
            _wrap(owner, attr, how, engine)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches an attach point's module right after it executes."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in {a[0] for a in ATTACH}:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        execute = getattr(loader, "exec_module", None)
        if execute is None or getattr(execute, _WRAPPED, False):
            return spec

        def exec_module(module: Any) -> None:
            execute(module)
            _patch(module)

        setattr(exec_module, _WRAPPED, True)
        loader.exec_module = exec_module  # type: ignore[union-attr,method-assign]
        return spec


def install() -> None:
    """Arm the attach points (idempotent); nothing happens unless ``SPEEDTRAP_AGENT_DIR`` is set."""
    if not os.environ.get(ENV_DIR) or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
    for name, *_ in ATTACH:
        if name in sys.modules:
            _patch(sys.modules[name])


def register() -> None:
    """vLLM's general-plugin entry point."""
    install()
