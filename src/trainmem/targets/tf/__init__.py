"""Keras on TensorFlow behind the Target interface (target.py): peak RSS on the CPU (cpu_process.py, with the oneDNN
kernels' scratch in cpu_kernel_rules.py), the BFC allocator's regions and nvidia-smi on a GPU (gpu_memory.py), and
the Keras section of the Estimate (targets/tf/keras_section.py)."""
