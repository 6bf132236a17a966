"""Keras: check a compiled model before fit, or let the callback do it at the start of fit. Run from the repository
root: python examples/train_keras.py"""

import logging

import keras
import numpy as np

from trainmem.integrations.keras import MemoryCheck, check

logging.basicConfig(level=logging.INFO, format="%(message)s")
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x, y = np.random.randn(1024, 64).astype("float32"), np.random.randint(0, 10, 1024)

print(check(model, x, batch_size=128).reason)  # uses the compiled optimizer and loss
model.fit(x, y, batch_size=128, epochs=1, steps_per_epoch=2, callbacks=[MemoryCheck(batch_size=128)], verbose=0)
