"""The release trees: each package's wheel (or sdist) downloaded once with pip into the cache and unpacked there
(Python and text files; for an sdist, the C-family sources of the folders named). Nothing is written into the clone."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("SPEEDTRAP_INCIDENTS_DIR", Path.home() / ".cache" / "speedtrap" / "incidents"))
_KEEP = (".py", ".json", ".txt", ".md", ".yaml")
SDIST_DIRS = {
    "llama_cpp_python": (
        "llama_cpp/",
        "vendor/llama.cpp/src/",
        "vendor/llama.cpp/include/",
        "vendor/llama.cpp/common/",
        "vendor/llama.cpp/gguf-py/gguf/",
    )
}
_KEEP_C = (".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh")


def _download(package: str, version: str, sdist: bool) -> Path:
    """The package's wheel (or sdist) from PyPI, downloaded once into the cache."""
    folder = CACHE / ("sdists" if sdist else "wheels")
    pattern = f"{package}-{version}.tar.gz" if sdist else f"{package}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        only = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
        spec = f"{package.replace('_', '-')}=={version}" if sdist else f"{package}=={version}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *only, "--disable-pip-version-check", "-q"]
        subprocess.run([*cmd, spec, "-d", str(folder)], check=True, timeout=1800)
        found = sorted(folder.glob(pattern))
    return found[0]


def tree_of(package: str, version: str) -> Path:
    tree = CACHE / "trees" / f"{package}-{version}"
    if package in SDIST_DIRS:
        if not (tree / SDIST_DIRS[package][0]).is_dir():
            with tarfile.open(_download(package, version, sdist=True)) as tf:
                for m in tf.getmembers():
                    rel = m.name.split("/", 1)[1] if "/" in m.name else ""
                    if m.isfile() and rel.startswith(SDIST_DIRS[package]) and rel.endswith(_KEEP + _KEEP_C):
                        m.name = rel
                        tf.extract(m, tree, filter="data")
        return tree
    if not (tree / package).is_dir():
        with zipfile.ZipFile(_download(package, version, sdist=False)) as zf:
            names = [n for n in zf.namelist() if n.startswith(f"{package}/") and n.endswith(_KEEP)]
            zf.extractall(tree, names)
    return tree
