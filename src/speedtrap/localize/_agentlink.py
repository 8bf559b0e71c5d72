"""The harness side of the in-worker agent: the launch environment, commands, results, requests.

See ``agent/speedtrap_agent.py`` for the agent itself. Every wait has a timeout; a missing,
unreadable or failed result is a :class:`ServerError` naming the role (the caller's word for the
server: ``base``, ``trial``, ``prefill``...) and the file, never a pass.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from speedtrap._errors import ServerError

AGENT_PATH = Path(__file__).with_name("agent")
AGENT_ENV = "SPEEDTRAP_AGENT_DIR"
PLUGIN = "speedtrap_agent"
Api = Literal["sglang", "openai"]
_POLL_S = 0.05


def agent_env(folder: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to add to a server's launch environment so that the agent runs in it.

    ``env`` is the launch's environment (default: this process's): its ``PYTHONPATH`` gets the agent's
    folder first, and a ``VLLM_PLUGINS`` allowlist, when set, gets ``speedtrap_agent`` appended.
    """
    base = os.environ if env is None else env
    paths = [str(AGENT_PATH), *(p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p)]
    out = {AGENT_ENV: str(Path(folder).resolve()), "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    plugins = base.get("VLLM_PLUGINS")
    if plugins is not None:
        names = [p.strip() for p in plugins.split(",") if p.strip()]
        out["VLLM_PLUGINS"] = ",".join([*names, PLUGIN] if PLUGIN not in names else names)
    return out


class AgentLink:
    """Commands to the agent of one server (``folder`` is its ``SPEEDTRAP_AGENT_DIR``)."""

    def __init__(self, folder: Path, role: str, timeout: float = 300.0) -> None:
        self.folder = Path(folder)
        self.role = role
        self.timeout = timeout

    def agents(self) -> list[dict[str, Any]]:
        """The processes where the agent attached to a model: one per rank (each says its rank and world
        size), in rank order; waits until every rank of the world the first says has attached."""
        deadline = time.monotonic() + min(self.timeout, 30.0)
        while True:
            found = []
            for path in sorted((self.folder / "agents").glob("*.json")):
                try:
                    found.append(json.loads(path.read_text()))
                except (OSError, ValueError):
                    continue
            world = max((int(a.get("world", 1)) for a in found), default=1)
            if (found and len(found) >= world) or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        if not found:
            raise ServerError(
                f"no speedtrap agent attached to a model in the {self.role} server ({self.folder / 'agents'} is empty)",
                "launch the server with agent_env(folder) added to its environment, and wait until it is healthy",
            )
        found.sort(key=lambda a: int(a.get("rank", 0)))
        ranks = [int(a.get("rank", 0)) for a in found]
        if ranks != list(range(world)):
            raise ServerError(
                f"the {self.role} server's agents attached as ranks {ranks} of a world of {world}",
                "wait until every rank has loaded its model (or relaunch); speedtrap reads every rank",
            )
        return found

    def send(self, action: str, pids: Sequence[int] = (), **fields: Any) -> str:
        """Write ``command.json`` atomically and wait until the agent has read it (every one of ``pids``:
        the ranks of one forward must all hold the command before the request); returns the command id."""
        ident = f"{action}-{uuid.uuid4().hex[:12]}"
        path = self.folder / "command.json"
        tmp = path.with_name(f".command.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"id": ident, "action": action, **fields}))
        os.replace(tmp, path)
        marks = [self.folder / f"{ident}.{pid}.seen" for pid in pids] or [self.folder / f"{ident}.seen"]
        for seen in marks:
            self._wait(seen, f"the {self.role} server's agent did not read {path} within {self.timeout:g} s")
        return ident

    def result(self, ident: str, pid: int) -> Path:
        """The folder of one agent's result for command ``ident``, once its ``done`` marker is there."""
        out = self.folder / "results" / ident / str(pid)
        done = out / "done"
        self._wait(done, f"the {self.role} server's agent wrote no {done} within {self.timeout:g} s")
        try:
            status = json.loads(done.read_text())
        except (OSError, ValueError):
            raise self.bad(done, "is unreadable") from None
        if not status.get("ok"):
            raise ServerError(
                f"the {self.role} server's agent failed: {status.get('error', 'no reason given')} ({done})",
                "read the server's log; the request's forward ran, the measurement did not",
            )
        return out

    def read_json(self, path: Path) -> Any:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise self.bad(path, "is missing") from None
        except (OSError, ValueError) as exc:
            raise self.bad(path, f"is unreadable ({type(exc).__name__})") from None

    def bad(self, path: Path, what: str) -> ServerError:
        return ServerError(
            f"the {self.role} server's agent file {path} {what}",
            "capture again from the running stack (speedtrap takes no missing or damaged file as a pass)",
        )

    def _wait(self, path: Path, problem: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not path.exists():
            if time.monotonic() >= deadline:
                raise ServerError(problem, "check that the server is alive and its log; raise the timeout if slow")
            time.sleep(_POLL_S)


def send_request(
    url: str, api: Api, ids: Sequence[int], new_tokens: int, *, model: str | None = None, timeout: float = 300.0
) -> None:
    """One greedy, teacher-forced request: the prompt's token ids, then ``new_tokens`` generated ones."""
    ids = [int(t) for t in ids]
    with httpx.Client(timeout=timeout, trust_env=False) as client:
        try:
            if api == "sglang":
                params = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
                response = client.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": params})
            else:
                name = model or _served_model(client, url)
                body = {"model": name, "prompt": ids, "max_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
                response = client.post(f"{url}/v1/completions", json=body)
        except httpx.HTTPError as exc:
            raise ServerError(f"the request to {url} failed: {type(exc).__name__}: {exc}", "check the server") from None
    if response.status_code != 200:
        problem = f"{url} answered HTTP {response.status_code}: {response.text[:300]}"
        raise ServerError(problem, "check the server's log")


def flush_cache(url: str, api: Api, timeout: float = 30.0) -> bool:
    """Empty the server's prefix cache (best effort), so that a repeated prompt is computed again.

    SGLang: ``POST /flush_cache``; vLLM: ``POST /reset_prefix_cache`` (its dev endpoints); a server
    without one answers 404 and is left as it is. True when the server said it flushed.
    """
    path = "/flush_cache" if api == "sglang" else "/reset_prefix_cache"
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            return client.post(f"{url}{path}").status_code == 200
    except httpx.HTTPError:
        return False


def _served_model(client: httpx.Client, url: str) -> str:
    try:
        return str(client.get(f"{url}/v1/models").json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        raise ServerError(f"{url}/v1/models names no model", "pass the served model's name (model=...)") from None
