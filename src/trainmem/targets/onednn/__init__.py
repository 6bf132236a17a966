"""What oneDNN (through ideep) allocates inside PyTorch's CPU convolution and LSTM kernels.

Plain arithmetic from the shapes of one op and a `CpuInfo` (targets/cpu_info.py): the capability
picks the kernels and their channel block, the thread count sizes per-thread scratch. Nothing here
imports torch or reads the running process. `conv` and `rnn` hold the public functions the CPU
target's rules call; `scratchpad` the booking arithmetic both share.
"""
