"""scripts/gpu-env.sh: carried wheels, whole or in parts, become importable on a machine without
network, the interpreter's own packages win, and Triton kernels are never left interpreted."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _wheel(folder: Path, name: str, body: str, padding: int = 0) -> Path:
    """A minimal pure-Python wheel; `padding` bytes of incompressible data make it large."""
    version = "1.0"
    info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", body)
        wheel.writestr(f"{name}/padding.bin", os.urandom(padding))
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


def _split(wheel: Path, folders: list[Path]) -> None:
    """Cut the wheel into len(folders) parts, one per folder, as gpu-wheels.sh --split-mb names them."""
    data = wheel.read_bytes()
    size = -(-len(data) // len(folders))
    for i, folder in enumerate(folders):
        folder.mkdir(exist_ok=True)
        (folder / f"{wheel.name}.part{i + 1}of{len(folders)}").write_bytes(data[i * size : (i + 1) * size])
    wheel.unlink()


def _run(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-env.sh"), *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_wheels_in_parts_across_folders_are_joined_and_importable(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    _wheel(first, "carriedsmall", "VALUE = 'small'\n")
    _split(_wheel(tmp_path, "carriedbig", "VALUE = 'big'\n", padding=200_000), [first, second])
    probe = (
        "import carriedbig, carriedsmall, os;"
        "print(carriedbig.VALUE, carriedsmall.VALUE, os.environ.get('TRITON_INTERPRET'))"
    )
    site = tmp_path / "site"
    args = ["--wheels", str(first), "--wheels", str(second), "--site", str(site)]
    result = _run(tmp_path, *args, "--", sys.executable, "-c", probe, env={"TRITON_INTERPRET": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["big", "small", "None"]
    # A second command on the same machine reuses the site and installs nothing again.
    again = _run(tmp_path, *args, "--", sys.executable, "-c", probe)
    assert again.returncode == 0, again.stderr
    assert "nothing to install" in again.stderr


def test_the_subfolders_of_a_wheel_folder_are_read_too(tmp_path):
    """gpu-wheels.sh --pack-mb sorts the files into .whl/1, .whl/2, ..., one per transfer."""
    wheels = tmp_path / ".whl"
    wheels.mkdir()
    _split(_wheel(tmp_path, "carriedbig", "VALUE = 'big'\n", padding=10_000), [wheels / "1", wheels / "2"])
    _wheel(wheels / "2", "carriedsmall", "VALUE = 'small'\n")
    probe = "import carriedbig, carriedsmall; print(carriedbig.VALUE, carriedsmall.VALUE)"
    result = _run(
        tmp_path, "--wheels", str(wheels), "--site", str(tmp_path / "site"), "--", sys.executable, "-c", probe
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["big", "small"]


def test_a_missing_part_is_named(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    _split(_wheel(tmp_path, "carriedbig", "", padding=10_000), [first, second])
    result = _run(tmp_path, "--wheels", str(first), "--", "true")
    assert result.returncode != 0
    assert "carriedbig-1.0-py3-none-any.whl arrived in parts [1] of 2; carry all of them" in result.stderr


def test_the_interpreters_own_packages_are_not_replaced(tmp_path):
    # A carried wheel of a project the interpreter already holds (pytest here) is left out.
    folder = tmp_path / "w"
    folder.mkdir()
    _wheel(folder, "pytest", "raise ImportError('the carried copy was installed')\n")
    result = _run(tmp_path, "--wheels", str(folder), "--", sys.executable, "-c", "import pytest")
    assert result.returncode == 0, result.stderr


def test_no_command_is_an_error(tmp_path):
    result = _run(tmp_path, "--wheels", str(tmp_path))
    assert result.returncode == 2
    assert "no command given; put it after --" in result.stderr
