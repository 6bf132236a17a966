"""The step Keras's model.fit runs on TensorFlow, traced from shapes alone in a tf.Graph (keras_graph.py trace_keras):
the graph's ops, Grappler's rewrite, loops, the executor's tensor lifetimes, and the private TensorFlow and Keras
APIs it needs (private.py)."""
