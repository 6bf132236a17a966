"""Installs that respect the user's environment: a torch the user already has stays, and a Keras-on-TensorFlow
user gets no torch.

pyproject.toml's core depends on neither framework; torch comes with the '[torch]', '[hf]', '[onnx]' and
'[vision]' extras, as a range (the oldest release verified by `make compat` on), not a pin: a pin would make
`pip install 'trainmem[torch]'` replace the user's torch, often a CUDA build of several GB, with another.
Checks, offline first:
- the declared requirements: no framework in the core, the same open torch range in every extra that has one,
  none in '[tensorflow]', and that range admits the torch of each of this project's environments (.venv:
  2.13.0, the CPU build; .venv-vision: 2.14.1, a CUDA build);
- pip, asked to install this checkout's '[torch]' into the running environment, plans no torch (a dry run);
- '[tensorflow]' reaches no torch through the installed requirements of TensorFlow and Keras;
- the command line in an environment without torch (this one's packages as links, less torch and what needs
  it): a Keras estimate runs, a PyTorch model gets the one-line hint for '[torch]', and with neither framework
  the hint names both.
Where a package index answers, pip also plans the installs a user runs into fresh environments (dry runs):
'[tensorflow]' into an empty one plans no torch; '[hf,plot]' into one that holds torch 2.8.0 keeps it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# pip resolving this checkout against what is installed takes ~10 s here (it builds the project's metadata
# with setuptools); a machine shared with other jobs can take several times that, never minutes
DRY_RUN_SECONDS = 180
# this project's environments, each with the torch the Makefile installs there
ENVIRONMENTS = (".venv", ".venv-vision")


def _declared() -> tuple[list[str], dict[str, list[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"], project["optional-dependencies"]


def _named(lines: list[str], names: set[str]) -> list:
    requirements = pytest.importorskip("packaging.requirements", reason="needs the packaging library")
    utils = pytest.importorskip("packaging.utils", reason="needs the packaging library")
    parsed = [requirements.Requirement(line) for line in lines]
    return [requirement for requirement in parsed if utils.canonicalize_name(requirement.name) in names]


def _torch_requirement():
    """The one torch range pyproject.toml declares: '[torch]''s, repeated by every extra that traces with torch."""
    _, extras = _declared()
    found = {extra: _named(lines, {"torch"}) for extra, lines in extras.items()}
    torch_lines = found["torch"]
    assert len(torch_lines) == 1, f"expected one torch requirement in the [torch] extra, got {extras['torch']}"
    for extra in ("hf", "onnx", "vision", "lightning"):
        assert [str(line) for line in found[extra]] == [str(torch_lines[0])], (extra, extras[extra])
    return torch_lines[0]


def test_the_core_depends_on_neither_framework():
    core, extras = _declared()
    frameworks = {"torch", "tensorflow", "tensorflow-cpu", "keras", "torchvision"}
    assert _named(core, frameworks) == [], f"pyproject.toml's core dependencies name a framework: {core}"
    assert _named(extras["tensorflow"], {"torch", "torchvision"}) == [], extras["tensorflow"]


def test_the_torch_range_has_no_upper_bound():
    """An upper bound (or a pin) would make pip replace a newer torch the user has; the range starts at the
    oldest verified release."""
    requirement = _torch_requirement()
    assert {spec.operator for spec in requirement.specifier} == {">="}, requirement
    assert requirement.specifier.contains("2.6.0") and requirement.specifier.contains("99.0")
    assert not requirement.specifier.contains("2.5.1")


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
    """`pip install '<checkout>[torch]'` with dependencies, as a user runs it, dry: the plan installs trainmem and
    no torch. --no-index keeps it offline and changes no decision: a torch already installed that meets
    the requirement is kept without looking at an index (pip's only-if-needed strategy), and one that
    does not would have to come from somewhere, so the plan would fail or list it — both fail here.
    --no-build-isolation builds the metadata with this environment's setuptools instead of a fetched one."""
    _skip_unless_venv_with_pip()
    import torch

    report = tmp_path / "install-report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
               "--no-index", "--no-build-isolation", f"{ROOT}[torch]"]
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


# ---- '[tensorflow]' brings no torch ------------------------------------------------------------------------------


def _requirement_closure(lines: list[str]) -> tuple[set[str], set[str]]:
    """The distributions `lines` reach through the installed packages' own requirements (markers evaluated
    here, no extras beyond those named), and the names reached that are not installed here."""
    requirements = pytest.importorskip("packaging.requirements", reason="needs the packaging library")
    utils = pytest.importorskip("packaging.utils", reason="needs the packaging library")
    reached, missing, queue = set(), set(), [requirements.Requirement(line) for line in lines]
    while queue:
        requirement = queue.pop()
        name = utils.canonicalize_name(requirement.name)
        if name in reached or name in missing:
            continue
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.add(name)
            continue
        reached.add(name)
        for line in distribution.requires or []:
            child = requirements.Requirement(line)
            extras = [{"extra": extra} for extra in requirement.extras] or [{"extra": ""}]
            if child.marker is None or any(child.marker.evaluate(environment) for environment in extras):
                queue.append(child)
    return reached, missing


def test_the_tensorflow_extra_reaches_no_torch_through_installed_requirements():
    """Offline: TensorFlow and Keras as installed here, and everything they require, never require torch."""
    _, extras = _declared()
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed in this environment (the [test] extra installs it)")
    reached, missing = _requirement_closure(extras["tensorflow"])
    assert "torch" not in reached, f"[tensorflow] reaches torch through {sorted(reached)}"
    assert "torch" not in missing
    assert {"tensorflow-cpu", "keras"} <= reached | missing, reached


# ---- what pip plans for fresh environments (needs an index) ------------------------------------------------------

# pip asks the index once per package; on a machine where no index answers, each try waits this long
INDEX_TIMEOUT = "15"


def _fresh_environment(root: Path, torch_version: str | None) -> Path:
    """An empty virtual environment (no pip: the running pip plans for it through --python), holding torch's
    package metadata at `torch_version` where one is given: pip sees that torch installed, as in a user's
    environment, without the wheel (several GB for a CUDA build) being there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    if torch_version is not None:
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        info = Path(purelib) / f"torch-{torch_version}.dist-info"
        info.mkdir(parents=True)
        source = importlib.metadata.distribution("torch").read_text("METADATA") or ""
        (info / "METADATA").write_text(re.sub(r"(?m)^Version: .*$", f"Version: {torch_version}", source))
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    return python


def _plan(python: Path, requirement: str, report: Path, *options: str) -> dict[str, str]:
    """pip's dry-run plan for `requirement` in the environment of `python`; skips where no index answers."""
    command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run", "--quiet",
               "--report", str(report), "--timeout", INDEX_TIMEOUT, "--retries", "1", *options, requirement]
    done = subprocess.run(command, capture_output=True, text=True, timeout=DRY_RUN_SECONDS)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        assert "ResolutionImpossible" not in output, f"{' '.join(command)}: no plan satisfies it:\n{output}"
        last = output.strip().splitlines()[-1] if output.strip() else f"exit {done.returncode}"
        pytest.skip(f"pip could not plan {requirement} here (no package index answers?): {last}")
    return {item["metadata"]["name"].lower(): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


def _skip_unless_pip_plans_for_other_environments() -> None:
    if importlib.util.find_spec("pip") is None:
        pytest.skip(f"this environment ({sys.prefix}) has no pip to ask")
    pip = tuple(int(part) for part in re.findall(r"\d+", importlib.metadata.version("pip"))[:2])
    if pip < (22, 3):
        pytest.skip(f"pip {importlib.metadata.version('pip')} here has no --python option (pip 22.3 added it)")


@pytest.mark.heavy
def test_the_tensorflow_extra_plans_no_torch_in_a_fresh_environment(tmp_path):
    """`pip install 'trainmem[tensorflow]'` into an empty environment, dry: TensorFlow, Keras and their
    requirements, no torch: what a Keras-on-TensorFlow user's install would download, planned and not downloaded."""
    _skip_unless_pip_plans_for_other_environments()
    python = _fresh_environment(tmp_path / "env", torch_version=None)
    planned = _plan(python, f"{ROOT}[tensorflow]", tmp_path / "report.json")
    assert "trainmem" in planned and "keras" in planned, planned
    assert not {"torch", "torchvision"} & set(planned), f"[tensorflow] would install {sorted(planned)}"


@pytest.mark.heavy
def test_hf_and_plot_keep_torch_2_8_in_a_fresh_environment(tmp_path):
    """An environment that holds torch 2.8.0 and nothing else: `pip install 'trainmem[hf,plot]'` plans
    transformers, peft, matplotlib and what they need, and keeps that torch (none of them bounds torch from
    above, nor does trainmem). torch 2.8.0 is there as its package metadata (this environment's torch's, at
    2.8.0), which is all pip reads of an installed torch; its wheel is an 888 MB CUDA build."""
    _skip_unless_pip_plans_for_other_environments()
    python = _fresh_environment(tmp_path / "env", torch_version="2.8.0")
    # offline, first: pip sees the torch 2.8.0 put there as installed (an empty plan for it)
    seen = _plan(python, "torch==2.8.0", tmp_path / "seen.json", "--no-index", "--no-deps")
    assert seen == {}, seen
    planned = _plan(python, f"{ROOT}[hf,plot]", tmp_path / "report.json")
    assert {"trainmem", "transformers", "peft", "matplotlib"} <= set(planned), planned
    assert "torch" not in planned, f"[hf,plot] would replace torch 2.8.0 with {planned['torch']}"


# ---- the command line where torch is not installed -------------------------------------------------------------


def _requires_any(distribution, names: set[str]) -> bool:
    requirements = pytest.importorskip("packaging.requirements", reason="needs the packaging library")
    utils = pytest.importorskip("packaging.utils", reason="needs the packaging library")
    for line in distribution.requires or []:
        requirement = requirements.Requirement(line)
        unconditional = requirement.marker is None or requirement.marker.evaluate({"extra": ""})
        if unconditional and utils.canonicalize_name(requirement.name) in names:
            return True
    return False


def _environment_without(root: Path, frameworks: set[str]) -> Path:
    """A virtual environment holding the running one's packages as links, less the distributions in
    `frameworks` and those that require them (transformers' peft, timm, torchvision …): to the import
    system and to package metadata alike, an environment where they were never installed. This checkout's
    source goes first on the path."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    source = Path(sysconfig.get_paths()["purelib"])
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    utils = pytest.importorskip("packaging.utils", reason="needs the packaging library")
    hidden_names = set(frameworks)
    distributions = list(importlib.metadata.distributions(path=[str(source)]))
    for _ in range(3):  # what requires what requires a framework
        hidden_names |= {utils.canonicalize_name(d.metadata["Name"]) for d in distributions
                         if _requires_any(d, hidden_names)}
    hidden_entries = set()
    for distribution in distributions:
        if utils.canonicalize_name(distribution.metadata["Name"]) in hidden_names:
            hidden_entries |= {Path(str(path)).parts[0] for path in distribution.files or [] if str(path)[:2] != ".."}
    for entry in source.iterdir():
        if entry.name not in hidden_entries and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)
    return python


def _trainmem(python: Path, *args: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([str(python), "-m", "trainmem", *args], capture_output=True, text=True,
                          timeout=DRY_RUN_SECONDS, env=environment, cwd=ROOT)


TORCH_FAMILY = {"torch"}
FRAMEWORKS = {"torch", "tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos", "keras", "tf-keras"}
SEED = ["mlp:1000-100-100-100-100-10", "--input-shape", "1000", "--batch-size", "256"]


@pytest.fixture(scope="module")
def without_torch(tmp_path_factory):
    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
        pytest.skip("TensorFlow and Keras are not installed in this environment (the [test] extra installs them)")
    python = _environment_without(tmp_path_factory.mktemp("without-torch") / "env", TORCH_FAMILY)
    check = subprocess.run([str(python), "-c", "import importlib.util as u, importlib.metadata as m; "
                            "print(u.find_spec('torch'), [d.metadata['Name'] for d in m.distributions() "
                            "if d.metadata['Name'].lower() == 'torch'])"], capture_output=True, text=True)
    assert check.stdout.split() == ["None", "[]"], check.stdout + check.stderr
    return python


@pytest.mark.heavy
def test_a_keras_estimate_runs_without_torch(without_torch):
    done = _trainmem(without_torch, "estimate", *SEED, "--framework", "keras")
    assert done.returncode == 0, done.stderr
    assert "131,410 parameters" in done.stdout and "Keras on TensorFlow" in done.stdout, done.stdout
    assert "process (peak RSS)" in done.stdout, done.stdout


def test_a_pytorch_model_without_torch_is_one_line_naming_the_torch_extra(without_torch):
    done = _trainmem(without_torch, "estimate", *SEED)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.startswith("trainmem")]
    assert lines == [done.stderr.strip().splitlines()[-1]] and len(lines) == 1, done.stderr
    assert "torch is not installed: pip install 'trainmem[torch]'" in lines[0], lines[0]
    assert "--framework keras" in lines[0], lines[0]


def test_neither_framework_is_one_line_naming_both_extras(tmp_path):
    python = _environment_without(tmp_path / "env", FRAMEWORKS)
    done = _trainmem(python, "estimate", *SEED)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr == ("trainmem: error: trainmem needs PyTorch or TensorFlow: pip install 'trainmem[torch]' "
                           "(or '[tensorflow]' for Keras models)\n"), done.stderr
    assert _trainmem(python, "devices").returncode == 0


# ---- the torchvision hint keeps the user's torch ----------------------------------------------------------------


@pytest.mark.parametrize(("torch_version", "command"), [
    ("2.8.0", "pip install 'trainmem[vision]' torch==2.8.0 'torchvision==0.23.*'"),
    ("2.13.0+cpu", "pip install 'trainmem[vision]' torch==2.13.0 'torchvision==0.28.*' "
                   "--extra-index-url https://download.pytorch.org/whl/cpu"),
    ("2.14.1+cu128", "pip install 'trainmem[vision]' torch==2.14.1 'torchvision==0.29.*' "
                     "--extra-index-url https://download.pytorch.org/whl/cu128"),
    ("2.99.0", "pip install 'trainmem[vision]' torch==2.99.0"),  # newer than the table: the pin alone
    (None, "pip install 'trainmem[vision]'"),
])
def test_the_vision_hint_names_the_torchvision_paired_with_the_installed_torch(monkeypatch, torch_version, command):
    from trainmem import install_hints

    monkeypatch.setattr(install_hints, "installed_version", lambda name: torch_version if name == "torch" else None)
    assert install_hints.vision_install() == command


def test_the_pairs_follow_torchvisions_table():
    """torchvision's README: torchvision 0.(N + 15) is built for torch 2.N, from 2.0 / 0.15 on."""
    from trainmem.install_hints import TORCHVISION_FOR_TORCH

    assert all(pair == f"0.{minor + 15}" for (major, minor), pair in TORCHVISION_FOR_TORCH.items() if major == 2)
    assert (2, 6) in TORCHVISION_FOR_TORCH, "the oldest supported torch has its torchvision"
