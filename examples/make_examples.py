"""Writes the example model files next to this script: the Keras file, the SavedModel and the safetensors
checkpoint that the README's commands name (`examples/net.yaml` and `examples/factory.py` are written by hand).

    .venv/bin/python examples/make_examples.py            # all three (needs keras, tensorflow and torch)
    .venv/bin/python examples/make_examples.py --only savedmodel --out /tmp/x

Each model is the same small MLP, 64 → 32 → 10 (2,410 parameters), so the files stay a few KB. trainmem reads
none of their weights: `.keras` is read as its config.json, a SavedModel through its serving signature,
`.safetensors` from its header.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERAS_FILE = "tiny_mlp.keras"
SAVED_MODEL_DIR = "tiny_mlp_savedmodel"
SAFETENSORS_FILE = "tiny_mlp.safetensors"
IN, HIDDEN, OUT = 64, 32, 10


def _keras_model():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input(shape=(IN,)), keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(OUT)], name="tiny_mlp")


def write_keras(out: Path) -> Path:
    path = out / KERAS_FILE
    _keras_model().save(path)
    return path


def write_saved_model(out: Path) -> Path:
    """Keras 3's model.export(): TensorFlow's SavedModel format with one serving endpoint (`serve`)."""
    import shutil

    path = out / SAVED_MODEL_DIR
    if path.exists():
        shutil.rmtree(path)
    _keras_model().export(str(path), format="tf_saved_model", verbose=False)
    return path


def write_safetensors(out: Path) -> Path:
    """The state dict of the same MLP as PyTorch holds it (nn.Linear's weight is out × in)."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    path = out / SAFETENSORS_FILE
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, str(path))
    return path


WRITERS = {"keras": write_keras, "savedmodel": write_saved_model, "safetensors": write_safetensors}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write into (default: examples/)")
    parser.add_argument("--only", choices=sorted(WRITERS), action="append", help="write only this one (repeatable)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(WRITERS):
        print(WRITERS[name](args.out))


if __name__ == "__main__":
    main()
