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
