"""Plain PyTorch: stop before the first step when training will not fit, and find the largest batch without a trial
step. Run from the repository root: python examples/train_guard.py"""

import torch

import trainmem

model = torch.nn.Sequential(torch.nn.Linear(1000, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
optimizer = torch.optim.Adam(model.parameters())
inputs, targets = torch.randn(256, 1000), torch.randint(0, 10, (256,))

# the largest batch for this model and optimizer on an A100 40GB, by estimates alone
print("largest batch on an a100-40gb:", trainmem.find_batch_size(model, optimizer, inputs, device="a100-40gb"))

# raises trainmem.DoesNotFit (a MemoryError, one line with the figures) before the block runs when it would not fit
# the memory this machine has free now
with trainmem.guard(model, optimizer, inputs) as check:
    print(check.reason)
    for _step in range(2):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
