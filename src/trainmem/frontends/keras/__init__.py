"""Keras model references in, a KerasSource out: `.keras` files, SavedModels, factories, and mlp: and layer specs
built as Keras models (reference.py). Which framework a reference is, is decided outside this package
(frontends/framework.py), so a PyTorch reference never passes through it."""
