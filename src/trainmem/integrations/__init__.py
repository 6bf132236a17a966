"""trainmem inside a training script: the estimate where people already decide batch sizes.

- `guard.py`: `check`, `guard` (a `with` block that raises DoesNotFit before the first step) and `find_batch_size`
  (accelerate's find_executable_batch_size without a trial step), for plain PyTorch;
- `hf_trainer.py`: `MemoryCheckCallback`, a transformers TrainerCallback;
- `lightning.py`: `MemoryCheck`, a Lightning Callback that can also pick the batch size;
- `keras.py`: `check(model, x, batch_size)` and `MemoryCheck`, a Keras Callback;
- `live.py`: the script's live objects (model, optimizer, one batch) read as an estimate's setup.
Each framework's module imports its framework when it is imported, with the extra to install when it is missing;
nothing here is imported by `import trainmem` except guard.py, which imports no framework.
"""
