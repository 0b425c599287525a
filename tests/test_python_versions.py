"""Python 3.11 to 3.13 are supported: `requires-python` admits each, every installed
dependency's own metadata admits each, and under each interpreter this machine has,
every module of the package compiles and the package imports.

The import under another interpreter is of the package alone (its top level imports no
dependency; the notebook functions import theirs when called), with every module
compiled: installing torch, transformers and the rest into a venv per interpreter
would take minutes and gigabytes per run, while what differs between these Python
versions for this code is its syntax and the standard library it imports at the top."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
SUPPORTED = ("3.11", "3.12", "3.13")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def interpreter(version: str) -> str | None:
    """A working `python{version}`: on the PATH, or one pyenv installed but does not shim."""
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{version}"), *sorted(glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python{version}"))]
    for candidate in filter(None, candidates):
        done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == version:
            return candidate
    return None


def test_requires_python_admits_exactly_the_supported_versions():
    allowed = SpecifierSet(PROJECT["requires-python"])
    assert all(f"{v}.0" in allowed for v in SUPPORTED)
    assert "3.10.12" not in allowed and "3.14.0" not in allowed


def test_every_installed_dependency_admits_the_supported_versions():
    refusing = []
    for requirement in map(Requirement, PROJECT["dependencies"]):
        requires = metadata.metadata(requirement.name).get("Requires-Python") or ""
        refusing += [f"{requirement.name} ({requires})" for v in SUPPORTED if f"{v}.0" not in SpecifierSet(requires)]
    assert refusing == []


COMPILE_AND_IMPORT = """
import pathlib, sys
for path in sorted(pathlib.Path("rnr_interp").rglob("*.py")):
    compile(path.read_text(encoding="utf-8"), str(path), "exec")
import rnr_interp
missing = [name for name in rnr_interp.__all__ if name not in dir(rnr_interp)]  # listed, not loaded: no deps here
print(rnr_interp.__version__, len(rnr_interp.__all__), missing)
"""


@pytest.mark.parametrize("version", SUPPORTED)
def test_package_compiles_and_imports_under(version):
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine (PATH or pyenv)")
    done = subprocess.run([python, "-s", "-B", "-c", COMPILE_AND_IMPORT], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(rf"{re.escape(PROJECT['version'])} \d+ \[\]", done.stdout.strip()), done.stdout
