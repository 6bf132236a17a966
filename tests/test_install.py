"""Installing trainmem next to a torch the user already has keeps that torch.

pyproject.toml declares a range of torch (the oldest release verified by `make compat` on), not a pin: a
pin would make `pip install trainmem` replace the user's torch, often a CUDA build of several GB, with
another. Two checks: pip, asked to install this checkout with its dependencies into the running
environment, plans no torch (a dry run: nothing changes); and the declared requirement admits the torch of
each of this project's environments (.venv: 2.13.0, the CPU build; .venv-vision: 2.14.1, a CUDA build)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# pip resolving this checkout against what is installed takes ~10 s here (it builds the project's metadata
# with setuptools); a machine shared with other jobs can take several times that, never minutes
DRY_RUN_SECONDS = 180
# this project's environments, each with the torch the Makefile installs there
ENVIRONMENTS = (".venv", ".venv-vision")


def _torch_requirement():
    requirements = pytest.importorskip("packaging.requirements", reason="needs the packaging library")
    utils = pytest.importorskip("packaging.utils", reason="needs the packaging library")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_lines = [requirements.Requirement(line) for line in declared
                   if utils.canonicalize_name(requirements.Requirement(line).name) == "torch"]
    assert len(torch_lines) == 1, f"expected one torch requirement in pyproject.toml, got {declared}"
    return torch_lines[0]


def _skip_unless_venv_with_pip() -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("runs only inside a virtual environment: a dry run against the system Python's packages "
                    f"({sys.prefix}) says nothing about the environments this project makes")
    if importlib.util.find_spec("pip") is None:
        pytest.skip(f"this virtual environment ({sys.prefix}) has no pip to ask")
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("pip builds the project's metadata with this environment's setuptools (>= 61, "
                    "pyproject.toml's build requirement), which is missing here; without it pip would fetch one")
    setuptools = tuple(int(part) for part in importlib.metadata.version("setuptools").split(".")[:2])
    if setuptools < (61, 0):
        pytest.skip(f"setuptools {setuptools[0]}.{setuptools[1]} here is older than pyproject.toml's build requirement (>= 61)")
    if setuptools < (70, 1) and importlib.util.find_spec("wheel") is None:
        # setuptools took bdist_wheel in from the wheel package in 70.1; before, metadata needs `wheel`
        pytest.skip(f"setuptools {setuptools[0]}.{setuptools[1]} here needs the wheel package to build metadata, "
                    "and this environment has none; without it pip would fetch one")


def test_pip_install_keeps_the_installed_torch(tmp_path):
    """`pip install <checkout>` with dependencies, as a user runs it, dry: the plan installs trainmem and
    no torch. --no-index keeps it offline and changes no decision: a torch already installed that meets
    the requirement is kept without looking at an index (pip's only-if-needed strategy), and one that
    does not would have to come from somewhere, so the plan would fail or list it — both fail here.
    --no-build-isolation builds the metadata with this environment's setuptools instead of a fetched one."""
    _skip_unless_venv_with_pip()
    import torch

    report = tmp_path / "install-report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
               "--no-index", "--no-build-isolation", str(ROOT)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=DRY_RUN_SECONDS)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert "trainmem" in planned, planned
    assert "torch" not in planned, (f"installing trainmem would replace torch {torch.__version__} with "
                                    f"{planned['torch']}")


def _installed_torch(environment: Path) -> str | None:
    for site_packages in sorted(environment.glob("lib/python*/site-packages")):
        for distribution in importlib.metadata.distributions(path=[str(site_packages)]):
            if distribution.metadata["Name"].lower() == "torch":
                return distribution.version
    return None


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_declared_range_admits_each_environments_torch(environment):
    requirement = _torch_requirement()
    version = _installed_torch(ROOT / environment)
    if version is None:
        pytest.skip(f"{environment} has no torch installed here (make test creates it)")
    assert requirement.specifier.contains(version), f"{requirement} refuses {environment}'s torch {version}"


def test_declared_range_admits_the_running_torch():
    import torch

    requirement = _torch_requirement()
    assert requirement.specifier.contains(importlib.metadata.version("torch")), (requirement, torch.__version__)
