"""Run the model's real training step on fake tensors and record every storage alloc and free."""
