from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "models.py"


def zoo(name: str) -> str:
    """A model reference to a factory in the test zoo."""
    return f"{MODELS}:{name}"


@pytest.fixture
def tmp_factory(tmp_path):
    def write(body: str, name: str = "factory") -> str:
        path = tmp_path / "user_model.py"
        path.write_text("import torch\nimport torch.nn as nn\n\n" + body)
        return f"{path}:{name}"
    return write


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
