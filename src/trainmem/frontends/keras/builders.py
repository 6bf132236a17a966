"""`mlp:` references and layer specs built as Keras models (`--framework keras`).

The same network as the torch build, layer for layer and parameter for parameter: Linear(in, out) is
Dense(out) (in × out + out parameters, keras/src/layers/core/dense.py build), Conv2d is Conv2D, and so
on. Keras writes images channels-last (its default image_data_format, and the only Conv2D layout
TensorFlow's CPU kernels take: tensorflow/core/kernels/conv_ops.cc), so a spec's channels-first input
[C, H, W] becomes (H, W, C); parameter counts do not change. Layers with no Keras counterpart here are
refused in one line. No TensorFlow import at module level.
"""

from __future__ import annotations

from typing import Any

from trainmem.errors import ModelRefError, quote

ACTIVATIONS = ("relu", "tanh", "gelu", "sigmoid", "silu", "softmax")
_LEAKY_DEFAULT = 0.01  # torch.nn.LeakyReLU's negative_slope default (Keras's is 0.3)


def mlp_layers(widths: list[int], activation: str = "relu", dropout: float = 0.0) -> list[tuple[str, dict[str, Any]]]:
    """The mlp: reference as Keras layers (class name, arguments): Dense(w, activation) …, Dense(widths[-1]),
    the activation inside Dense as a Keras user writes it (keras.layers.Dense(activation=) applies it)."""
    layers: list[tuple[str, dict[str, Any]]] = []
    for index, width in enumerate(widths[1:]):
        last = index == len(widths) - 2
        layers.append(("Dense", {"units": width, "activation": None if last else activation, "name": f"dense_{index}"}))
        if not last and dropout > 0:
            layers.append(("Dropout", {"rate": dropout, "name": f"dropout_{index}"}))
    return layers


def build_keras_mlp(widths: list[int], activation: str = "relu", dropout: float = 0.0) -> Any:
    """Sequential(Input(widths[0]), the layers of mlp_layers)."""
    from trainmem.frontends.keras.imports import import_keras

    keras = import_keras()
    layers = [getattr(keras.layers, name)(**kwargs) for name, kwargs in mlp_layers(widths, activation, dropout)]
    return keras.Sequential([keras.Input(shape=(widths[0],), name="input"), *layers], name="mlp")


def mlp_factory_source(widths: list[int], activation: str = "relu", dropout: float = 0.0) -> str:
    """A factory file's text that builds the same Sequential with Keras alone (a measured process imports
    nothing of trainmem: its RSS is the user's)."""
    layers = ", ".join(f"keras.layers.{name}(**{kwargs!r})" for name, kwargs in mlp_layers(widths, activation, dropout))
    return ("import keras\n\n\ndef model():\n"
            f"    return keras.Sequential([keras.Input(shape=({widths[0]},), name='input'), {layers}], name='mlp')\n")


_CHANNELS_FIRST = ("conv", "maxpool", "avgpool", "adaptiveavgpool")


def keras_input_shape(shape: tuple[int, ...], plan: list[tuple[str, dict[str, Any]]]) -> tuple[int, ...]:
    """A spec's per-sample shape in Keras's channels-last layout where its layers read channels first
    (convolutions, pooling): [C, H, W] → (H, W, C), [C, L] → (L, C). Other specs (a sequence [L, F] for a
    batch_first LSTM, a vector) are already in Keras's layout."""
    channels_first = any(name.startswith(_CHANNELS_FIRST) for name, _ in plan)
    return tuple(shape) if len(shape) < 2 or not channels_first else (*shape[1:], shape[0])


def build_keras_spec(plan: list[tuple[str, dict[str, Any]]], input_shape: tuple[int, ...], input_dtype: str,
                     where: str) -> Any:
    """A Keras Sequential from a spec's layer plan (frontends/spec.py _plan_layers: torch's arguments,
    input sizes already inferred)."""
    from trainmem.frontends.keras.imports import import_keras

    keras = import_keras()
    layers: list[Any] = [keras.Input(shape=keras_input_shape(input_shape, plan), dtype=input_dtype, name="input")]
    layers += [_keras_layer(keras, name, dict(kwargs), index, where) for index, (name, kwargs) in enumerate(plan)]
    return keras.Sequential(layers, name="spec")


def _conv(keras: Any, cls: Any, kw: dict[str, Any], index: int, where: str) -> Any:
    padding = kw.get("padding", 0)
    if padding not in (0, "valid", "same") and not _same_padding(padding, kw.get("kernel_size")):
        raise ModelRefError(f"expected layer {index}'s padding as 0, 'valid', 'same' or the kernel's half (what "
                            f"Keras's padding='same' does), got {quote(padding)}", where=where)
    same = padding not in (0, "valid")
    return cls(kw["out_channels"], kw["kernel_size"], strides=kw.get("stride", 1), padding="same" if same else "valid",
               dilation_rate=kw.get("dilation", 1), groups=kw.get("groups", 1), use_bias=kw.get("bias", True),
               name=f"layer_{index}")


def _same_padding(padding: Any, kernel: Any) -> bool:
    kernels = kernel if isinstance(kernel, (list, tuple)) else [kernel]
    paddings = padding if isinstance(padding, (list, tuple)) else [padding] * len(kernels)
    return all(isinstance(k, int) and k % 2 == 1 and p == k // 2 for k, p in zip(kernels, paddings))


def _recurrent(keras: Any, cls: Any, kw: dict[str, Any], index: int, where: str) -> Any:
    if kw.get("num_layers", 1) != 1 or kw.get("bidirectional") or kw.get("proj_size", 0):
        raise ModelRefError(f"expected layer {index} as one unidirectional recurrent layer in Keras, got "
                            f"{quote(kw)}", where=where)
    return cls(kw["hidden_size"], return_sequences=True, use_bias=kw.get("bias", True), name=f"layer_{index}")


def _keras_layer(keras: Any, name: str, kw: dict[str, Any], index: int, where: str) -> Any:
    """One spec layer as a Keras layer. Softmax and LayerNorm act on Keras's last axis (the channels of an
    image, where torch's LayerNorm takes the width): the same sizes for vectors and sequences."""
    L, label = keras.layers, f"layer_{index}"
    simple = {
        "relu": lambda: L.ReLU(name=label), "tanh": lambda: L.Activation("tanh", name=label),
        "gelu": lambda: L.Activation("gelu", name=label), "sigmoid": lambda: L.Activation("sigmoid", name=label),
        "silu": lambda: L.Activation("silu", name=label),
        "leakyrelu": lambda: L.LeakyReLU(negative_slope=kw.get("negative_slope", _LEAKY_DEFAULT), name=label),
        "softmax": lambda: L.Softmax(axis=-1, name=label),
        "dropout": lambda: L.Dropout(kw.get("p", 0.5), name=label),
        "linear": lambda: L.Dense(kw["out_features"], use_bias=kw.get("bias", True), name=label),
        "layernorm": lambda: L.LayerNormalization(epsilon=kw.get("eps", 1e-5), name=label),
        "batchnorm": lambda: L.BatchNormalization(epsilon=kw.get("eps", 1e-5), momentum=1 - kw.get("momentum", 0.1),
                                                  name=label),
        "embedding": lambda: L.Embedding(kw["num_embeddings"], kw["embedding_dim"], name=label),
        "conv1d": lambda: _conv(keras, L.Conv1D, kw, index, where),
        "conv2d": lambda: _conv(keras, L.Conv2D, kw, index, where),
        "conv3d": lambda: _conv(keras, L.Conv3D, kw, index, where),
        "lstm": lambda: _recurrent(keras, L.LSTM, kw, index, where),
        "gru": lambda: _recurrent(keras, L.GRU, kw, index, where),
        "rnn": lambda: _recurrent(keras, L.SimpleRNN, kw, index, where),
        "maxpool1d": lambda: L.MaxPooling1D(kw.get("kernel_size", 2), strides=kw.get("stride"), name=label),
        "maxpool2d": lambda: L.MaxPooling2D(kw.get("kernel_size", 2), strides=kw.get("stride"), name=label),
        "avgpool1d": lambda: L.AveragePooling1D(kw.get("kernel_size", 2), strides=kw.get("stride"), name=label),
        "avgpool2d": lambda: L.AveragePooling2D(kw.get("kernel_size", 2), strides=kw.get("stride"), name=label),
        "flatten": lambda: L.Flatten(name=label),
    }
    if name.startswith("adaptiveavgpool") and kw.get("output_size") in (1, [1], (1,), [1, 1], (1, 1)):
        pool = L.GlobalAveragePooling1D if name.endswith("1d") else L.GlobalAveragePooling2D
        return pool(name=label)  # (N, C): torch keeps (N, C, 1, …), a flatten after it is a no-op either way
    if name not in simple:
        raise ModelRefError(f"expected layers with a Keras counterpart ({', '.join(sorted(simple))}, "
                            f"adaptiveavgpool to 1), got {quote(name)} (layer {index})", where=where)
    return simple[name]()
