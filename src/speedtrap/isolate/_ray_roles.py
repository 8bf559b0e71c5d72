"""A stack's roles on separate Ray nodes: one placement group per stack, one bundle per role, each on its node.

A role that says where it runs (``[target.roles.NAME] node = "label"`` or ``resources = {...}``) makes every
trial's stack a placement group of one bundle per role, spread over the nodes (``SPREAD``), each bundle held
to the nodes that carry its role's label (Ray's ``bundle_label_selector``). In each bundle a :class:`RoleHost`
actor launches its role's process on its node under the launch guard (``speedtrap.stack``: the actor's process
is the guard's lifeline, so the actor dying takes its role down), picks the role's ports free on that node and
reports the node's address, which fills ``{host}`` and ``{ROLE.host}`` (a router's ``--prefill
http://{prefill.host}:{prefill.port}``, a KV transfer's bind address). The trial's worker (the oracle) holds
no bundle; it launches the roles through :class:`RayPlacement` and probes the entry over the network.

Before anything is placed, :func:`check_roles` refuses a label no Ray node carries (naming the nodes that
exist) and a role asking for more ranks (``--tp``) than any of its nodes has cores.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from speedtrap._errors import UsageError
from speedtrap.stack import LaunchSpec, RoleSpec, Server, StackSpec, free_port, start

_CALL_S = 30.0  # how long a call to a role's actor may take before its node counts as gone


def placed(stack: StackSpec | None) -> bool:
    """Whether the stack's roles go each on its own node (a role says where it runs)."""
    return stack is not None and any(r.placed for r in stack.roles)


def _node_name(node: Mapping[str, Any]) -> str:
    labels = {k: v for k, v in (node.get("Labels") or {}).items() if not str(k).startswith("ray.io/")}
    shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "no labels"
    return f"{str(node.get('NodeID', '?'))[:8]} ({shown}; {node.get('Resources', {}).get('CPU', 0):g} CPUs)"


def label_selector(role: RoleSpec, nodes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Ray's label selector for the role's bundle (``{}``: any node); a UsageError when no node carries it."""
    if role.node is None:
        return {}
    key, _, value = role.node.rpartition("=")
    matching = [
        n for n in nodes
        if any((not key or k == key) and v == value for k, v in (n.get("Labels") or {}).items())
    ]  # fmt: skip
    if not matching:
        raise UsageError(
            f"target.roles.{role.name}.node = {role.node!r}: no Ray node carries that label; the nodes: "
            + "; ".join(_node_name(n) for n in nodes),
            'label a node (ray start --labels \'{"KEY": "VALUE"}\'), or change the role\'s node',
        )
    if key:
        return {key: value}
    keys = {k for n in matching for k, v in (n.get("Labels") or {}).items() if v == value}
    return {sorted(keys)[0]: value}


def _matching(role: RoleSpec, nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    selector = label_selector(role, nodes)
    return [n for n in nodes if all((n.get("Labels") or {}).get(k) == v for k, v in selector.items())]


def role_bundle(role: RoleSpec) -> dict[str, float]:
    """What the role's bundle reserves: its ``resources``, else one CPU per rank."""
    if role.resources:
        return {k: v for k, v in role.resources if v > 0} or {"CPU": float(role.ranks)}
    return {"CPU": float(role.ranks)}


def check_roles(stack: StackSpec, nodes: Sequence[Mapping[str, Any]]) -> None:
    """Refuse, before any launch, a role whose label no node carries or whose ranks no node of it can hold."""
    alive = [n for n in nodes if n.get("Alive", True)]
    for role in stack.roles:
        candidates = _matching(role, alive)
        ranks = role.ranks
        bundle = role_bundle(role)
        kind = "GPU" if bundle.get("GPU", 0) > 0 else "CPU"
        most = max((float(n.get("Resources", {}).get(kind, 0.0)) for n in candidates), default=0.0)
        if ranks > most:
            where = f"node {role.node!r}" if role.node else "any node"
            raise UsageError(
                f"target.roles.{role.name} asks for {ranks} ranks (--tp {ranks}), but {where} has at most "
                f"{most:g} {kind}s: " + "; ".join(_node_name(n) for n in candidates),
                "lower the role's --tp, or place it on a bigger node",
            )
        for name, amount in bundle.items():
            have = max((float(n.get("Resources", {}).get(name, 0.0)) for n in candidates), default=0.0)
            if amount > have:
                raise UsageError(
                    f"target.roles.{role.name}.resources asks for {name} {amount:g}, but its nodes have at most "
                    f"{have:g}",
                    "lower the role's resources, or add a node that has them",
                )


def stack_group(stack: StackSpec, nodes: Sequence[Mapping[str, Any]]) -> Any:
    """A placement group for one whole stack: a bundle per role (in the stack's order), spread over the nodes."""
    from ray.util import placement_group

    bundles = [role_bundle(r) for r in stack.roles]
    selectors = [label_selector(r, nodes) for r in stack.roles]
    return placement_group(bundles, strategy="SPREAD", bundle_label_selector=selectors)


class RoleHost:
    """The actor body of one role: launches the role's process on its node (under the guard) and watches it."""

    def __init__(self) -> None:
        self.server: Server | None = None

    def where(self) -> tuple[str, str]:
        """This node's Ray id and its address (what other nodes reach it at)."""
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        return free_port("0.0.0.0")

    def start(self, spec: LaunchSpec, log: str, port: int) -> int:
        self.stop()
        self.server = start(spec, Path(log), port)
        return self.server.pid

    def poll(self) -> int | None:
        return self.server.proc.poll() if self.server is not None else None

    def stop(self) -> int | None:
        if self.server is None:
            return None
        code = self.server.stop()
        self.server = None
        return code


class _RemoteProc:
    """A role process on another node, with ``subprocess.Popen``'s face as the stack reads it."""

    def __init__(self, owner: RemoteServer) -> None:
        self._owner = owner
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self._owner.pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._owner.ask_poll()
        return self.returncode


class RemoteServer(Server):
    """A role launched by its :class:`RoleHost` on its node; quacks like a :class:`Server`."""

    def __init__(self, actor: Any, spec: LaunchSpec, log_path: Path, port: int, node: str, pid: int) -> None:
        self.actor = actor
        self.spec = spec
        self.log_path = log_path
        self.port = port
        self.node = node
        self.slot = None
        self._pid = pid
        self.proc = _RemoteProc(self)  # type: ignore[assignment]
        self.started = time.monotonic()
        self.before: set[str] = set()  # its node's files are its actor's Server's to clean up
        self.removed: list[str] = []

    @property
    def pid(self) -> int:
        return self._pid

    def ask_poll(self) -> int | None:
        import ray

        try:
            code: int | None = ray.get(self.actor.poll.remote(), timeout=_CALL_S)
        except Exception:  # the actor (or its node) is gone: its guard took the role down with it
            return -9
        return code

    def stop(self) -> int | None:
        import ray

        with contextlib.suppress(Exception):
            ray.get(self.actor.stop.remote(), timeout=_CALL_S + self.spec.stop_timeout)
        if self.proc.returncode is None:
            self.proc.returncode = -15
        return self.proc.returncode


class RayPlacement:
    """The roles of one trial slot's placement group: one :class:`RoleHost` per bundle, made once per worker."""

    def __init__(self, group: Any, roles: Sequence[str]) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.roles = list(roles)
        self.actors: dict[str, Any] = {}
        for i, role in enumerate(self.roles):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)
            self.actors[role] = (
                ray.remote(RoleHost)
                .options(num_cpus=0, scheduling_strategy=strategy, max_restarts=0, max_concurrency=2)
                .remote()
            )
        where = ray.get([self.actors[r].where.remote() for r in self.roles], timeout=120)
        self.nodes = {r: w[0] for r, w in zip(self.roles, where, strict=True)}
        self.hosts = {r: w[1] for r, w in zip(self.roles, where, strict=True)}

    def host(self, role: str) -> str:
        return self.hosts[role]

    def free_port(self, role: str) -> int:
        import ray

        port: int = ray.get(self.actors[role].free_port.remote(), timeout=_CALL_S)
        return port

    def start(self, role: str, spec: LaunchSpec, log: Path, port: int) -> Server:
        import ray

        log.parent.mkdir(parents=True, exist_ok=True)
        pid = ray.get(self.actors[role].start.remote(spec, str(log), port), timeout=_CALL_S)
        node = f"{self.nodes[role][:12]} at {self.hosts[role]}"  # Ray's node id, as `ray list nodes` shows it
        return RemoteServer(self.actors[role], spec, log, port, node, pid)

    def placement(self) -> dict[str, str]:
        """Each role's Ray node id."""
        return dict(self.nodes)

    def close(self) -> None:
        import ray

        for actor in self.actors.values():
            with contextlib.suppress(Exception):
                ray.get(actor.stop.remote(), timeout=_CALL_S)
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self.actors = {}
