"""Keras 3 models for the TensorFlow CPU accuracy table (benchmarks/accuracy_keras_cpu.py).

Each factory takes no arguments and returns a built, uncompiled `keras.Model` with a fixed input shape,
so that it can be named as `benchmarks/keras_models.py:mlp` and built both in a fresh measured process
and inside the tracer's graph. Sizes are chosen so that the two batch sizes of each model span tensor
peaks from a few MB to about 1.5 GB, while one fit step stays within seconds on 2 cores.

Targets: every model ends in class logits, trained with sparse categorical cross-entropy on integer
labels (one label per sample; `lstm_seq` one per time step is not used here).
"""

from __future__ import annotations


def _keras():
    import keras

    return keras


def mlp():
    """The seed MLP: 1000-100×4-10, 131,410 parameters."""
    keras = _keras()
    inputs = keras.Input((1000,), name="x")
    hidden = inputs
    for index in range(4):
        hidden = keras.layers.Dense(100, activation="relu", name=f"dense_{index}")(hidden)
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(hidden), name="mlp")


def cnn_bn():
    """Three 3×3 convolutions with BatchNorm on 64×64 RGB, two max-pools, global pooling, 10 classes."""
    keras = _keras()
    layers = keras.layers
    inputs = keras.Input((64, 64, 3), name="image")
    hidden = inputs
    for index, (filters, pool) in enumerate(((32, False), (32, True), (64, True))):
        hidden = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"conv_{index}")(hidden)
        hidden = layers.BatchNormalization(name=f"bn_{index}")(hidden)
        hidden = layers.ReLU(name=f"relu_{index}")(hidden)
        if pool:
            hidden = layers.MaxPooling2D(2, name=f"pool_{index}")(hidden)
    hidden = layers.GlobalAveragePooling2D(name="gap")(hidden)
    return keras.Model(inputs, layers.Dense(10, name="logits")(hidden), name="cnn_bn")


def _residual_block(layers, hidden, filters: int, stride: int, name: str):
    shortcut = hidden
    out = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False, name=f"{name}_conv1")(hidden)
    out = layers.BatchNormalization(name=f"{name}_bn1")(out)
    out = layers.ReLU(name=f"{name}_relu1")(out)
    out = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv2")(out)
    out = layers.BatchNormalization(name=f"{name}_bn2")(out)
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False, name=f"{name}_proj")(shortcut)
        shortcut = layers.BatchNormalization(name=f"{name}_proj_bn")(shortcut)
    out = layers.Add(name=f"{name}_add")([out, shortcut])
    return layers.ReLU(name=f"{name}_relu2")(out)


def resnet_small():
    """A ResNet-style network on 32×32 RGB: a 32-filter stem and three stages of two basic blocks."""
    keras = _keras()
    layers = keras.layers
    inputs = keras.Input((32, 32, 3), name="image")
    hidden = layers.Conv2D(32, 3, padding="same", use_bias=False, name="stem_conv")(inputs)
    hidden = layers.ReLU(name="stem_relu")(layers.BatchNormalization(name="stem_bn")(hidden))
    for stage, filters in enumerate((32, 64, 128)):
        for block in range(2):
            stride = 2 if stage and not block else 1
            hidden = _residual_block(layers, hidden, filters, stride, f"s{stage}b{block}")
    hidden = layers.GlobalAveragePooling2D(name="gap")(hidden)
    return keras.Model(inputs, layers.Dense(10, name="logits")(hidden), name="resnet_small")


def lstm():
    """Two stacked LSTMs (128 units) over 64 time steps of 32 features, 10 classes."""
    keras = _keras()
    inputs = keras.Input((64, 32), name="sequence")
    hidden = keras.layers.LSTM(128, return_sequences=True, name="lstm_0")(inputs)
    hidden = keras.layers.LSTM(128, name="lstm_1")(hidden)
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(hidden), name="lstm")


def transformer_encoder():
    """Two post-norm encoder blocks (MultiHeadAttention 4×32, LayerNorm, Dense 512) over 128 tokens
    of a 4,000-word vocabulary, width 128, mean-pooled to 10 classes."""
    keras = _keras()
    layers = keras.layers
    inputs = keras.Input((128,), dtype="int32", name="tokens")
    hidden = layers.Embedding(4000, 128, name="embed")(inputs)
    for index in range(2):
        attended = layers.MultiHeadAttention(4, 32, name=f"mha_{index}")(hidden, hidden)
        hidden = layers.LayerNormalization(name=f"ln1_{index}")(layers.Add(name=f"add1_{index}")([hidden, attended]))
        ffn = layers.Dense(512, activation="relu", name=f"ffn1_{index}")(hidden)
        ffn = layers.Dense(128, name=f"ffn2_{index}")(ffn)
        hidden = layers.LayerNormalization(name=f"ln2_{index}")(layers.Add(name=f"add2_{index}")([hidden, ffn]))
    hidden = layers.GlobalAveragePooling1D(name="pool")(hidden)
    return keras.Model(inputs, layers.Dense(10, name="logits")(hidden), name="transformer_encoder")


def embedding_bag():
    """An embedding model: 200 token ids per sample from a 50,000-word vocabulary, width 64, averaged,
    then Dense 64 and 2 classes (a text classifier of the fastText kind)."""
    keras = _keras()
    layers = keras.layers
    inputs = keras.Input((200,), dtype="int32", name="tokens")
    hidden = layers.Embedding(50000, 64, name="embed")(inputs)
    hidden = layers.GlobalAveragePooling1D(name="pool")(hidden)
    hidden = layers.Dense(64, activation="relu", name="dense")(hidden)
    return keras.Model(inputs, layers.Dense(2, name="logits")(hidden), name="embedding_bag")


# ---- calibration models (benchmarks/calibrate_tf_cpu.py): synthetic, not part of the accuracy table ----

def _dense_stack(depth: int):
    """`depth` Dense(8, relu) layers on 8 inputs: the graph grows with depth, the tensors hardly at all."""
    keras = _keras()
    inputs = keras.Input((8,), name="x")
    hidden = inputs
    for index in range(depth):
        hidden = keras.layers.Dense(8, activation="relu", name=f"d{index}")(hidden)
    return keras.Model(inputs, keras.layers.Dense(2, name="logits")(hidden), name=f"dense_stack_{depth}")


def dense_stack_0():
    return _dense_stack(0)


def dense_stack_24():
    return _dense_stack(24)


def dense_stack_48():
    return _dense_stack(48)


def dense_stack_96():
    return _dense_stack(96)


def wide_input():
    """One Dense(2) on 4,096 features: the dataset's bytes grow with samples, the graph and weights do not."""
    keras = _keras()
    inputs = keras.Input((4096,), name="x")
    return keras.Model(inputs, keras.layers.Dense(2, name="logits")(inputs), name="wide_input")


def tiny_conv():
    """One 3×3 Conv2D (8 filters) with BatchNorm on 16×16×3, pooled to 2 classes: the convolution kernels'
    first use (their library pages, Eigen's contraction buffers) at KB of tensors."""
    keras = _keras()
    layers = keras.layers
    inputs = keras.Input((16, 16, 3), name="image")
    hidden = layers.ReLU(name="relu")(layers.BatchNormalization(name="bn")(layers.Conv2D(8, 3, name="conv")(inputs)))
    hidden = layers.GlobalAveragePooling2D(name="gap")(hidden)
    return keras.Model(inputs, layers.Dense(2, name="logits")(hidden), name="tiny_conv")
