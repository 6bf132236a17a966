"""Every private TensorFlow and Keras API trainmem uses, reached here and nowhere else (as trace/torch_private.py
does for PyTorch), so that a TensorFlow or Keras upgrade that moves one breaks in one place.

Private means what the projects do not document as API: TensorFlow's `tensorflow.python` and `tensorflow.core`
modules, an underscore attribute of a TensorFlow graph, of a Keras layer or variable. Checked against
TensorFlow 2.21 and Keras 3.15.1 (the versions the [test] extra pins). Each function imports what it needs when
called: TensorFlow is an optional extra, and importing it costs seconds. measure/keras_child.py, the ground
truth's child process, asks TensorFlow whether oneDNN is on by itself: it imports nothing of trainmem.
tests/test_private_apis.py holds every other module to this one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def flatten_layers(layer: Any, include_self: bool = True, recursive: bool = True) -> Iterator[Any]:
    """A Keras layer's sublayers in tracking order (Layer._flatten_layers: the order Keras builds and tracks
    them, which `model.layers` gives only for the top level)."""
    return layer._flatten_layers(include_self=include_self, recursive=recursive)


def graph_function(graph: Any, name: str) -> Any:
    """The function a graph registers under `name` (a While loop's body), or None: Graph._get_function."""
    return graph._get_function(name)


def function_def_graph(definition: Any, input_shapes: list) -> Any:
    """A FunctionDef as a FuncGraph of its own, built in a fresh graph so that nothing is registered with the
    eager context (tensorflow/python/framework/function_def_to_graph.py)."""
    from tensorflow.python.framework import ops
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

    with ops.Graph().as_default():
        return function_def_to_graph(definition, input_shapes=input_shapes)


def grappler_optimize(graph_def: Any, configure: Any) -> Any:
    """Grappler's meta optimizer over `graph_def` as the runtime runs it (tf_optimizer.OptimizeGraph, the
    Python binding of grappler/grappler_item_builder + meta_optimizer): `configure(meta)` edits the
    MetaGraphDef (devices, the fetch collection) before the optimizer runs; returns the optimized GraphDef."""
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    configure(meta)
    return tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)


def saved_model_message() -> Any:
    """An empty SavedModel protocol buffer (tensorflow/core/protobuf/saved_model.proto), to parse a
    saved_model.pb without loading the model."""
    from tensorflow.core.protobuf import saved_model_pb2

    return saved_model_pb2.SavedModel()


def swap_torch_value(variable: Any, make: Any) -> None:
    """Keras on the torch backend: replace the torch tensor behind a Keras variable (Variable._value, which
    `variable.value` returns, autocast aside) by `make(old tensor)`."""
    variable._value = make(variable._value)


def retrack_torch_parameters(module: Any) -> None:
    """Keras on the torch backend: rebuild a TorchModuleWrapper/Layer's ParameterDict from its variables'
    current values (TorchLayer._track_variables, which model.parameters() and zero_grad() walk); a module
    without one is left alone."""
    if hasattr(module, "_track_variables") and hasattr(module, "_torch_params"):
        module._track_variables()


def saved_model_layer_class(keras: Any) -> type:
    """keras.layers.TFSMLayer with two private hooks of its own overridden (TFSMLayer._add_existing_weight,
    Layer._track_variable): the restored variables named as Keras names them, a single output unwrapped."""
    class SavedModelLayer(keras.layers.TFSMLayer):
        """TFSMLayer whose variables are named as Keras names them. Restored in a graph, a variable's name
        carries TensorFlow's output suffix (dense/kernel:0), and the optimizer's slot names built from it
        (base_optimizer.add_variable_from_reference) are not valid scope names: the ':' goes."""

        def _add_existing_weight(self, weight: Any) -> None:
            name = weight.name.replace("/", "_").replace(":", "_")
            # backend/tensorflow/core.py Variable._initialize keeps a tf.Variable initializer as the
            # variable itself: the restored function and the optimizer update the same variable
            self._track_variable(keras.Variable(initializer=weight, trainable=weight.trainable,
                                                  dtype=weight.dtype, shape=weight.shape, name=name))

        def call(self, inputs: Any, training: bool = False, **kwargs: Any) -> Any:
            outputs = super().call(inputs, training=training, **kwargs)
            if isinstance(outputs, dict) and len(outputs) == 1:  # a signature returns {"output_0": tensor}
                return next(iter(outputs.values()))
            return outputs

    return SavedModelLayer
