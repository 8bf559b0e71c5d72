"""Trials on a Ray cluster: one worker (a Ray actor) per trial slot, each reserving one trial's resources.

``pip install 'speedtrap[ray]'``. The driver (the process running the search) keeps the trial
store: workers return trial records and the driver commits each one as it comes back, so
``--resume`` works exactly as with the local executor.

A stack's trial runs whole on one node, its worker in a placement group of one bundle per role (``_ray_place``);
a stack whose roles say where they run gets a bundle per role on its own node, each role launched there by its
own actor (``_ray_roles``).

Each worker builds the oracle from its recipe once (an in-process model loads once per worker; a
divergence reference server starts once per worker) and runs one trial at a time; a worker is an
actor rather than a task for that reason, and it holds the per-trial resources (``num_gpus``,
``num_cpus``, custom resources) for the run. A worker that dies mid-trial (its process killed, its
node lost) makes that trial fail over: a new worker is started, on another node when one has room,
and the trial runs there once more; if that worker dies too, the trial is recorded as failed with
the error and the log it left, and the search goes on with the verdict ``error`` for it.

Files a trial writes (server log, probe report) land in the run directory on the worker's node;
the worker sends them back with the record, and the driver writes those it does not already see
(a cluster without a shared filesystem).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._errors import SpeedtrapError, UsageError
from speedtrap.isolate._executor import Oracle, OracleRecipe, TrialOutcome, TrialRequest, oracle_recipe, run_trial
from speedtrap.isolate._ray_place import group_table, remove_group, stack_placement, stack_roles
from speedtrap.isolate._ray_roles import check_roles, placed

# What a worker sends back beside the record: files under this size (server logs, probe reports).
_MAX_FILE_BYTES = 8 << 20
_LOCATE_S = 120.0  # how long to wait for a new worker to report its node
_CLOSE_S = 60.0  # how long workers get to stop their servers before they are killed
# Environment variables a worker gets from the driver (never the whole environment: secrets stay here).
FORWARDED_ENV = ("SPEEDTRAP_CACHE_DIR", "HF_HOME", "TRANSFORMERS_OFFLINE")


@dataclass(frozen=True)
class TrialResources:
    """What one trial reserves on the cluster: CPUs, GPUs, and custom resources by name."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    custom: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "search.resources") -> TrialResources:
        values: dict[str, float] = {}
        for key, value in table.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise UsageError(f"{where}.{key} = {value!r} is not a non-negative number", f"write {key} = 1")
            values[str(key)] = float(value)
        for reserved in ("CPU", "GPU"):
            if reserved in values:
                raise UsageError(
                    f"{where}.{reserved} is set by num_{reserved.lower()}s", f"write num_{reserved.lower()}s = 1"
                )
        cpus = values.pop("num_cpus", 1.0)
        gpus = values.pop("num_gpus", 0.0)
        return cls(cpus, gpus, values)

    def as_dict(self) -> dict[str, float]:
        return {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.custom}

    def slots(self, nodes: Sequence[Mapping[str, float]]) -> int:
        """How many trials fit at once on nodes with these total resources (each trial on one node)."""
        need = {name: amount for name, amount in self.as_dict().items() if amount > 0}
        if not need:
            return len(nodes)
        return sum(min(int(have.get(name, 0.0) // amount) for name, amount in need.items()) for have in nodes)

    def describe(self) -> str:
        return ", ".join(f"{k} {v:g}" for k, v in self.as_dict().items() if v > 0) or "nothing"


class _Worker:
    """The actor body: builds the oracle on first use, runs one trial per call.

    The recipe comes pickled (bytes) and is unpickled inside ``run``, so a recipe the worker cannot
    rebuild (a module missing on its node) is an error of the run, not a dead worker.
    """

    def __init__(self, recipe: bytes, env: Mapping[str, str], group: Any = None, roles: Sequence[str] = ()) -> None:
        os.environ.update(env)
        self.recipe = recipe
        self.oracle: Oracle | None = None
        self.group, self.roles = group, tuple(roles)  # roles on their own nodes: the stack's placement group
        self.placement: Any = None

    def where(self) -> tuple[str, int]:
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def run(self, request: TrialRequest, retries: int) -> tuple[TrialOutcome, dict[str, bytes]]:
        if self.oracle is None:
            self.oracle = _rebuild(self.recipe)
            if self.group is not None:  # each role launched by its own actor, on its bundle's node
                from speedtrap.isolate._ray_roles import RayPlacement

                self.placement = RayPlacement(self.group, self.roles)
                self.oracle.launcher.placement = self.placement  # type: ignore[attr-defined]
        outcome = run_trial(self.oracle, request, retries)
        return outcome, _trial_files(request)

    def close(self) -> None:
        """Stop the oracle and every server this worker started (also while a trial is running)."""
        from speedtrap.stack import stop_all

        if self.oracle is not None:
            with contextlib.suppress(Exception):
                self.oracle.close()
            self.oracle = None
        stop_all()
        if self.placement is not None:
            self.placement.close()
            self.placement = None


def _rebuild(recipe: bytes) -> Oracle:
    from ray import cloudpickle

    try:
        build: OracleRecipe = cloudpickle.loads(recipe)
    except Exception as exc:
        raise UsageError(
            f"the oracle cannot be rebuilt on a Ray worker: {type(exc).__name__}: {exc}",
            "install speedtrap and every module the oracle uses on each node (same versions), "
            "or run with the local executor",
        ) from None
    return build()


def _trial_files(request: TrialRequest) -> dict[str, bytes]:
    if request.workdir is None or not request.workdir.is_dir():
        return {}
    out: dict[str, bytes] = {}
    for path in sorted(request.workdir.glob(f"{request.label}*")):
        if path.is_file() and path.stat().st_size <= _MAX_FILE_BYTES:
            out[path.name] = path.read_bytes()
    return out


def _keep_files(request: TrialRequest, files: Mapping[str, bytes]) -> None:
    if request.workdir is None:
        return
    for name, data in files.items():
        path = request.workdir / Path(name).name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


@dataclass
class _Slot:
    actor: Any
    node: str = ""
    pid: int = 0
    group: Any = None  # a stack's placement group: one bundle per role, all on one node (STRICT_PACK)


class RayExecutor:
    """Runs a batch of trials at once on a Ray cluster (``address``) or a local one started here.

    ``workers`` trial slots (default: as many as the cluster's resources hold); each trial reserves
    ``resources``. A trial whose worker dies is run once more on a fresh worker, preferably on
    another node; ``close()`` stops the workers (and their oracles' servers) and disconnects.
    """

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        resources: TrialResources | None = None,
    ) -> None:
        try:
            import ray
        except ImportError:
            raise UsageError(
                "--executor ray needs Ray, which is not installed", "pip install 'speedtrap[ray]'"
            ) from None
        self._ray = ray
        self.resources = resources or TrialResources()
        self.address = address
        self._started_here = False
        if not ray.is_initialized():
            if address:
                _check_reachable(address)
            kwargs: dict[str, Any] = {
                "log_to_driver": False,
                "logging_level": logging.WARNING,
                "include_dashboard": False,
            }
            try:
                ray.init(address=address, **kwargs)
            except Exception as exc:  # Ray raises many kinds here; all mean "no cluster"
                where = f"at {address}" if address else "(a local one)"
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise UsageError(
                    f"cannot connect to the Ray cluster {where}: {first}",
                    "check --address (host:port of a head started with `ray start --head`), or leave it out",
                ) from None
            self._started_here = True
        if workers is not None and workers < 1:
            raise UsageError(f"--workers {workers} must be at least 1", "pass --workers 1 or more")
        nodes = [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]
        fits = self.resources.slots(nodes)
        if fits < 1 or (workers is not None and workers > fits):
            self.close()
            asked = f"{workers} workers" if workers is not None else "one worker"
            raise UsageError(
                f"the Ray cluster holds {fits} trial(s) of {{{self.resources.describe()}}} at once, not {asked}",
                "lower --workers or [search] resources, or add nodes",
            )
        self.capacity = workers or fits
        self._spread: Any = None  # a stack whose roles each go on their own node (``_ray_roles``)
        self._spread_capacity = workers or 1  # whole stacks placed at once then: search.parallel, else one
        self._slots: list[_Slot] = []
        self._recipe = b""  # the oracle's recipe, pickled once per oracle
        self._roles: tuple[str, ...] = ()  # a stack's roles: each slot is a placement group of one bundle each
        self._oracle: Oracle | None = None  # kept, so that the identity check below cannot be fooled
        self.failovers = 0  # trials moved to a fresh worker after theirs died
        self.moves: list[tuple[str, str]] = []  # (node of the dead worker, node of its replacement)

    # ------------------------------------------------------------------------------------------

    def _new_slot(self, avoid_node: str | None = None) -> _Slot:
        ray = self._ray
        options: dict[str, Any] = {
            "num_cpus": self.resources.num_cpus,
            "num_gpus": self.resources.num_gpus,
            "max_restarts": 0,
            "max_task_retries": 0,
        }
        if self.resources.custom:
            options["resources"] = dict(self.resources.custom)
        group = None
        args: tuple[Any, ...] = ()
        if self._spread is not None:  # each role on its own node: the worker holds nothing, its role actors do
            from speedtrap.isolate._ray_roles import stack_group

            group = stack_group(self._spread, [n for n in ray.nodes() if n.get("Alive")])
            options.update(num_cpus=0, num_gpus=0)
            options.pop("resources", None)
            args = (group, self._roles)
        elif self._roles:  # a trial's whole stack on one node (preferably not the dead worker's)
            other = self._other_node(avoid_node) if avoid_node else None
            group, placed = stack_placement(self.resources, self._roles, other)
            options.update(placed)
        elif avoid_node:
            other = self._other_node(avoid_node)
            if other is not None:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                    other, soft=True, _spill_on_unavailable=True
                )
        env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        env.setdefault("OMP_NUM_THREADS", str(max(1, int(self.resources.num_cpus))))
        # Two threads: close() must reach a worker whose trial is still running (to stop its servers).
        actor = ray.remote(_Worker).options(max_concurrency=2, **options).remote(self._recipe, env, *args)
        return _Slot(actor, group=group)

    def _other_node(self, avoid: str) -> str | None:
        need = self.resources.as_dict()
        for node in self._ray.nodes():
            if not node.get("Alive") or node.get("NodeID") == avoid:
                continue
            have = node.get("Resources", {})
            if all(have.get(name, 0.0) >= amount for name, amount in need.items() if amount > 0):
                return str(node["NodeID"])
        return None

    def _locate(self, slots: Sequence[_Slot]) -> None:
        refs = [s.actor.where.remote() for s in slots if not s.node]
        todo = [s for s in slots if not s.node]
        unknown: tuple[type[BaseException], ...] = (*self._dead_errors(), self._ray.exceptions.GetTimeoutError)
        for slot, ref in zip(todo, refs, strict=True):
            # Dead already (its trial fails over) or still waiting for room: where it runs stays unknown.
            with contextlib.suppress(*unknown):
                slot.node, slot.pid = self._ray.get(ref, timeout=_LOCATE_S)

    def _ensure_slots(self, oracle: Oracle, wanted: int) -> None:
        if self._oracle is not oracle:
            self._stop_slots()
            from ray import cloudpickle

            try:
                self._recipe = cloudpickle.dumps(oracle_recipe(oracle))
            except Exception as exc:  # whatever pickling raises
                raise UsageError(
                    f"{type(oracle).__name__} cannot be sent to Ray workers: {type(exc).__name__}: {exc}",
                    "use the local executor",
                ) from None
            self._oracle = oracle
            self._roles = stack_roles(oracle)
            stack = getattr(getattr(oracle, "target", None), "stack", None)
            self._spread = stack if placed(stack) else None
            if self._spread is not None:  # refused before anything is placed: a missing label, too many ranks
                check_roles(self._spread, self._ray.nodes())
                wanted = min(wanted, self._spread_capacity)
                self.capacity = self._spread_capacity
        new = [self._new_slot() for _ in range(max(0, wanted - len(self._slots)))]
        self._locate(new)
        self._slots.extend(new)

    def start(self, oracle: Oracle) -> float:
        """Start every worker for ``oracle`` now (else the first batch does); returns the seconds it took."""
        t0 = time.perf_counter()
        self._ensure_slots(oracle, self.capacity)
        return time.perf_counter() - t0

    def _dead_errors(self) -> tuple[type[BaseException], ...]:
        exc = self._ray.exceptions
        return (
            exc.RayActorError, exc.WorkerCrashedError, exc.NodeDiedError, exc.ObjectLostError, exc.OutOfMemoryError,
            exc.LocalRayletDiedError,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------

    def run(
        self, requests: Sequence[TrialRequest], oracle: Oracle, retries: int
    ) -> Iterator[tuple[TrialRequest, TrialOutcome]]:
        if not requests:
            return
        ray = self._ray
        self._ensure_slots(oracle, min(self.capacity, len(requests)))
        queue = list(requests)
        deaths: dict[str, list[str]] = {}  # trial label -> how its workers died
        idle = list(self._slots)
        running: dict[Any, tuple[_Slot, TrialRequest, float]] = {}
        while queue or running:
            while queue and idle:
                slot, request = idle.pop(0), queue.pop(0)
                running[slot.actor.run.remote(request, retries)] = (slot, request, time.time())
            done, _ = ray.wait(list(running), num_returns=1)
            slot, request, started = running.pop(done[0])
            try:
                outcome, files = ray.get(done[0])
            except self._dead_errors() as exc:
                idle.append(self._replace(slot))
                lost = deaths.setdefault(request.label, [])
                lost.append(_death_line(exc, slot))
                if len(lost) == 1:  # once more, on the fresh worker (another node when one has room)
                    self.failovers += 1
                    queue.insert(0, request)
                    continue
                yield request, _failed(request, lost, started)
                continue
            except ray.exceptions.RayTaskError as exc:
                _reraise(exc)
            except ray.exceptions.RayError as exc:
                first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
                raise UsageError(
                    f"Ray could not run trial {request.label}: {type(exc).__name__}: {first[:300]}",
                    "check the cluster (ray status) and [search] resources",
                ) from None
            idle.append(slot)
            _keep_files(request, files)
            if request.label in deaths:
                outcome = _after_failover(outcome, deaths[request.label])
            yield request, outcome

    def _replace(self, dead: _Slot) -> _Slot:
        new = self._new_slot(avoid_node=dead.node or None)
        self._locate([new])
        self.moves.append((dead.node, new.node))
        self._slots = [s for s in self._slots if s is not dead] + [new]
        self._remove_group(dead)
        return new

    def _remove_group(self, slot: _Slot) -> None:
        remove_group(slot.group)
        slot.group = None

    def placement(self) -> list[dict[str, Any]]:
        """Each slot's placement group as Ray reports it: its strategy and the node of each bundle."""
        return [group_table(s.group) for s in self._slots if s.group is not None]

    def role_nodes(self) -> list[str]:
        """Where each role of a stack placed role by role ran: one line per role, naming the Ray node (its id as
        `ray list nodes` shows it, its labels, its address) of each stack placed now (``[]``: no such stack)."""
        if self._spread is None:
            return []
        nodes = {str(n.get("NodeID")): n for n in self._ray.nodes()}
        where: dict[str, list[str]] = {role: [] for role in self._roles}
        for slot in self._slots:
            if slot.group is None:
                continue
            with contextlib.suppress(Exception):  # a group removed meanwhile: nothing to say about it
                for role, node_id in zip(self._roles, group_table(slot.group)["nodes"], strict=False):
                    node = nodes.get(str(node_id), {})
                    labels = ", ".join(
                        f"{k}={v}" for k, v in sorted((node.get("Labels") or {}).items()) if not k.startswith("ray.io/")
                    )
                    shown = f"{str(node_id)[:12]} ({labels or 'no labels'}) at {node.get('NodeManagerAddress', '?')}"
                    if shown not in where[role]:
                        where[role].append(shown)
        return [f"{role} on Ray node {' and '.join(shown)}" for role, shown in where.items() if shown]

    def _stop_slots(self) -> None:
        ray = self._ray
        closing = [s.actor.close.remote() for s in self._slots]
        if closing:
            with contextlib.suppress(Exception):  # a dead worker has nothing left to close
                ray.get(closing, timeout=_CLOSE_S)
        for slot in self._slots:
            with contextlib.suppress(Exception):
                ray.kill(slot.actor)
            self._remove_group(slot)
        self._slots = []

    def close(self) -> None:
        if getattr(self, "_slots", None):
            self._stop_slots()
        if self._started_here:
            self._ray.shutdown()
            self._started_here = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_reachable(address: str) -> None:
    """Fail fast on a head that does not answer: Ray itself retries for minutes before it gives up."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"--address {address!r} is not host:port", "write e.g. --address 10.0.0.1:6379")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as exc:
        raise UsageError(
            f"no Ray cluster answers at {address} ({exc.strerror or type(exc).__name__})",
            "start one with `ray start --head`, check the address, or leave --address out for a local cluster",
        ) from None


def _reraise(exc: BaseException) -> None:
    """An error raised inside a trial (bad input, a bug) ends the run here as it would locally."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, SpeedtrapError):
        raise cause from None
    if isinstance(cause, BaseException):
        raise cause
    raise exc


def _death_line(exc: BaseException, slot: _Slot) -> str:
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    where = f" (node {slot.node[:12]}, pid {slot.pid})" if slot.node else ""
    return f"the Ray worker died mid-trial{where}: {type(exc).__name__}: {first[:300]}"


def _trial_log(request: TrialRequest) -> str | None:
    if request.workdir is None:
        return None
    logs = sorted(request.workdir.glob(f"{request.label}*.log"))
    return str(logs[-1]) if logs else None


def _failed(request: TrialRequest, why: list[str], started: float) -> TrialOutcome:
    error = f"{why[-1]}; failed over once and died again" if len(why) > 1 else why[-1]
    return TrialOutcome(None, error, _trial_log(request), len(why), started, time.time())


def _after_failover(outcome: TrialOutcome, why: list[str]) -> TrialOutcome:
    """A trial that ran on a second worker: its attempts count the lost one."""
    return dataclasses.replace(outcome, attempts=outcome.attempts + len(why))
