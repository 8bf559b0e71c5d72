"""Which vLLM plugins a live server loads: the entry points installed where it runs, filtered by
``VLLM_PLUGINS`` the way vLLM filters them (unset: every installed plugin; else the names listed).

The installed entry points are read from the ``site-packages`` folders the process has mapped
(``/proc/PID/maps``: the shared libraries of torch and friends live there), so nothing is imported
or run; on a remote host (``--ssh``) only ``VLLM_PLUGINS`` is shown.

Only vLLM reads these groups: an entry point installed beside another server (SGLang's venv holds one from
``smg-grpc-servicer``) is never loaded there. A process runs vLLM when its command line runs vLLM's module or
script, or it has a file of an installed ``vllm`` package mapped.
"""

from __future__ import annotations

import configparser
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PLUGIN_GROUPS = ("vllm.general_plugins", "vllm.platform_plugins")
PLUGINS_ENV = "VLLM_PLUGINS"
_SITE = ("site-packages", "dist-packages")


@dataclass(frozen=True)
class PluginEntry:
    """One installed plugin entry point and whether the process's ``VLLM_PLUGINS`` lets it load."""

    group: str
    name: str
    target: str  # module:function
    distribution: str  # the package that declares it, "name version"
    loaded: bool
    reason: str = ""  # why it is or is not loaded

    @property
    def state(self) -> str:
        return ("loaded" if self.loaded else "installed, not loaded") + (f": {self.reason}" if self.reason else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "name": self.name,
            "target": self.target,
            "distribution": self.distribution,
            "loaded": self.loaded,
            "reason": self.reason,
        }


def selected(env: dict[str, str]) -> list[str] | None:
    """The plugin names ``VLLM_PLUGINS`` allows (None: all), parsed as vLLM parses it."""
    raw = env.get(PLUGINS_ENV)
    return None if raw is None else [name.strip() for name in raw.split(",")]


def site_dirs(maps: str) -> list[Path]:
    """The site-packages folders of the files a process has mapped, in first-seen order."""
    out: list[Path] = []
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
        parts = Path(path.strip()).parts
        for i, part in enumerate(parts):
            if part in _SITE:
                site = Path(*parts[: i + 1])
                if site not in out:
                    out.append(site)
                break
    return out


def installed_entry_points(site: Path) -> list[tuple[str, str, str, str]]:
    """(group, name, target, distribution) of the plugin groups declared in one site-packages folder."""
    out: list[tuple[str, str, str, str]] = []
    for file in sorted(site.glob("*.dist-info/entry_points.txt")):
        parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        try:
            parser.read_string(file.read_text(errors="replace"))
        except (OSError, configparser.Error):
            continue
        dist = file.parent.name.removesuffix(".dist-info").replace("-", " ", 1)
        for group in PLUGIN_GROUPS:
            if parser.has_section(group):
                out.extend((group, name, value.strip(), dist) for name, value in parser.items(group))
    return out


def runs_vllm(argv: list[str], maps: str | None) -> bool:
    """Whether the process is a vLLM one: ``python -m vllm...``, the ``vllm`` script, or vLLM's files mapped."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m" and argv[i + 1].split(".")[0] == "vllm":
            return True
    if any(Path(arg).name == "vllm" for arg in argv[:2]):
        return True
    for line in (maps or "").splitlines():
        fields = line.split(maxsplit=5)
        parts = Path(fields[5].strip()).parts if len(fields) == 6 else ()
        if any(part in _SITE and parts[i + 1 : i + 2] == ("vllm",) for i, part in enumerate(parts)):
            return True
    return False


def process_plugins(maps: str | None, env: dict[str, str], argv: list[str] | None = None) -> list[PluginEntry]:
    """The plugins installed where the process runs (when its maps are readable), marked loaded or not:
    loaded only in a vLLM process (``argv`` None: assumed vLLM) and where ``VLLM_PLUGINS`` selects them."""
    allowed = selected(env)
    if maps is None:  # remote: what VLLM_PLUGINS asks for, installation unknown
        if argv is not None and not runs_vllm(argv, None):
            return []
        return [PluginEntry(PLUGIN_GROUPS[0], name, "?", "?", True, "VLLM_PLUGINS") for name in allowed or [] if name]
    vllm = argv is None or runs_vllm(argv, maps)
    seen: set[tuple[str, str]] = set()
    out = []
    for site in site_dirs(maps):
        for group, name, target, dist in installed_entry_points(site):
            if (group, name) in seen:
                continue
            seen.add((group, name))
            if not vllm:
                out.append(PluginEntry(group, name, target, dist, False, "this process is not vLLM"))
            elif allowed is None or name in allowed:
                out.append(PluginEntry(group, name, target, dist, True))
            else:
                out.append(PluginEntry(group, name, target, dist, False, "not selected by VLLM_PLUGINS"))
    return out
