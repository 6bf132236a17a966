from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "models.py"


def zoo(name: str) -> str:
    """A model reference to a factory in the test zoo."""
    return f"{MODELS}:{name}"


def skip_where_torch_refuses(strategy: str, **layout) -> None:
    """Skip a test that needs the installed torch to trace `strategy` (a plan test whose other layouts must
    evaluate), with the refusal the user gets there (trace/torch_private.py LATER_TORCH; `make compat` on 2.6)."""
    from trainmem.errors import TorchVersionError
    from trainmem.setup.layout import ParallelLayout, Strategy
    from trainmem.trace.torch_private import require_torch_for

    try:
        require_torch_for(ParallelLayout(strategy=Strategy(strategy), world_size=2, **layout).resolve())
    except TorchVersionError as refusal:
        pytest.skip(f"refused on this torch: {refusal}")


@pytest.fixture
def tmp_factory(tmp_path):
    def write(body: str, name: str = "factory") -> str:
        path = tmp_path / "user_model.py"
        path.write_text("import torch\nimport torch.nn as nn\n\n" + body)
        return f"{path}:{name}"
    return write


@pytest.fixture(autouse=True)
def _no_allocator_settings_from_the_environment(monkeypatch):
    """The CLI takes PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF, and for Keras on TensorFlow
    TF_FORCE_GPU_ALLOW_GROWTH / TF_GPU_ALLOCATOR, from the environment (cli/options.py with_environment): a
    developer's own setting would move every GPU figure. Tests that want one set it."""
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True, scope="session")
def _no_user_calibration(tmp_path_factory):
    """Tests see the bundled calibrations only: a `trainmem calibrate` the developer ran on this machine (the
    user's cache directory) would move every CPU figure. Fresh processes the tests start inherit it too."""
    import os

    from trainmem.targets.calibrations import ENV_DIR

    previous = os.environ.get(ENV_DIR)
    os.environ[ENV_DIR] = str(tmp_path_factory.mktemp("trainmem-cache"))
    yield
    if previous is None:
        os.environ.pop(ENV_DIR, None)
    else:
        os.environ[ENV_DIR] = previous


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under `make compat`, a test of a feature that the installed torch refuses (TorchVersionError: '--strategy
    fsdp needs torch >= 2.7 (this is torch 2.6.0 …'; or a plan whose every layout it refused) is skipped with that
    line, as the user gets it, rather than failed: it cannot run there. Only when the installed torch really is older than the one named, so on the dev
    pin an unexpected refusal still fails."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or not report.failed:
        return
    import re

    from trainmem.errors import TrainmemError

    error = call.excinfo.value  # the refusal itself, or a plan/fit/compare that evaluated nothing because of it
    needed = re.search(r"needs torch >= (\d+)\.(\d+)", str(error)) if isinstance(error, TrainmemError) else None
    if needed is None:
        return
    from trainmem.trace.torch_private import torch_release

    if torch_release()[:2] < (int(needed.group(1)), int(needed.group(2))):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1], f"Skipped: refused on this torch: {error}")


@pytest.fixture(autouse=True, scope="session")
def _no_trace_cache_in_process():
    """In this process tests trace every run: a test that monkeypatches a rule would otherwise be answered from
    a trace an earlier test stored (the cache key sees trainmem's files, not a patched function). The commands
    tests start in fresh processes use the cache, in the session's own cache directory (above)."""
    from trainmem.trace import cache_store

    with cache_store.switched(False):
        yield

