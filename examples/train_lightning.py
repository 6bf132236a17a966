"""Lightning: the callback estimates the fit as the Trainer will run it; with pick_batch_size=True it sets the largest
batch that fits (as Lightning's BatchSizeFinder does, with no trial step). Run from the repository root:
python examples/train_lightning.py"""

import logging

import lightning as L
import torch

from trainmem.integrations.lightning import MemoryCheck

logging.basicConfig(level=logging.INFO, format="%(message)s")


class Classifier(L.LightningModule):
    def __init__(self, batch_size=32):
        super().__init__()
        self.batch_size = batch_size  # pick_batch_size sets it
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
        return torch.utils.data.DataLoader(data, batch_size=self.batch_size, shuffle=True)


check = MemoryCheck(device="t4", pick_batch_size=True)  # plan for a T4: the largest batch that fits there
trainer = L.Trainer(max_steps=2, accelerator="cpu", callbacks=[check], logger=False, enable_checkpointing=False)
model = Classifier()
trainer.fit(model)
print("batch size picked:", model.batch_size)
