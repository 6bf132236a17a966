"""The estimate inside training scripts (trainmem/integrations): guard, check and find_batch_size for plain PyTorch,
and the callbacks of transformers' Trainer, Lightning and Keras, each run for real on the CPU (tiny models, two
steps). Each is held to `trainmem.estimate` / `trainmem.fit` of the same setup written as a factory file
(tests/integration_models.py), so that reading the live objects (integrations/live.py) is checked by a path that
does not share it."""

from __future__ import annotations

import logging

import pytest
import torch

import trainmem
from conftest import ROOT
from trainmem.errors import SetupError
from trainmem.integrations.guard import check
from trainmem.integrations.live import optimizer_values

FACTORIES = ROOT / "tests" / "integration_models.py"
PLANNED = "custom:capacity=1GiB,cc=8.0"  # a GPU planned for: its capacity is the room, as fit has it


def factory(name: str) -> str:
    return f"{FACTORIES}:{name}"


def same_figures(one, other) -> None:
    """The same estimate, but for the libraries the script's process has imported, which a live check counts
    (integrations/live.py model_libraries) and a factory reference does not."""
    def own(est):
        return {key: value for key, value in est.process_parts.items() if not key.startswith("librar")}

    assert (one.tensor_bytes, own(one)) == (other.tensor_bytes, own(other))


def library_parts(est) -> set:
    return {key for key in est.process_parts if key.startswith("librar")}


def test_check_equals_the_estimate_of_the_same_setup():
    import integration_models as models

    model = models.mlp()
    verdict = check(model, torch.optim.Adam(model.parameters(), foreach=True), torch.randn(256, 64))
    reference = trainmem.estimate(factory("mlp_factory"), batch_size=256, optimizer="adam", optimizer_impl="foreach")
    same_figures(verdict.estimate, reference)
    assert verdict.fits and verdict.batch_size == 256 and "fits on cpu" in verdict.reason


def test_guard_raises_before_the_block_and_names_the_figures():
    import integration_models as models

    model = models.mlp()
    ran = []
    with pytest.raises(trainmem.DoesNotFit) as raised:
        with trainmem.guard(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(4_000_000, 64),
                            device=PLANNED):
            ran.append(True)
    assert ran == [] and isinstance(raised.value, MemoryError)
    line = str(raised.value)
    assert "\n" not in line and "does not fit on custom:capacity=1GiB" in line and "batch 4,000,000" in line
    with trainmem.guard(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(8, 64)) as verdict:
        assert verdict.fits


def test_find_batch_size_is_fits_answer():
    import integration_models as models

    model = models.mlp()
    found = trainmem.find_batch_size(model, torch.optim.AdamW(model.parameters()), torch.randn(3, 64), device=PLANNED)
    assert found == trainmem.fit(factory("mlp_factory"), device=PLANNED, optimizer="adamw").best


def test_optimizers_read_as_trainmem_names_them():
    model = torch.nn.Linear(4, 4)
    params = list(model.parameters())
    assert optimizer_values(torch.optim.SGD(params, lr=0.1, momentum=0.9), model) == {"optimizer": "momentum"}
    assert optimizer_values(torch.optim.AdamW(params, fused=True), model) == {"optimizer": "adamw",
                                                                              "optimizer_impl": "fused"}
    assert optimizer_values(torch.optim.Adam(params, foreach=False), model) == {"optimizer": "adam",
                                                                               "optimizer_impl": "for-loop"}


@pytest.mark.parametrize("make,said", [
    (lambda p: torch.optim.Adam(p, amsgrad=True), "without amsgrad"),
    (lambda p: torch.optim.RMSprop(p, momentum=0.9), "without momentum"),
    (lambda p: torch.optim.Adam(p[:1]), "1 of them against 2 trainable"),
    (lambda p: torch.optim.LBFGS(p), "got torch.optim.lbfgs.LBFGS"),
])
def test_unmodelled_optimizers_are_refused_in_one_line(make, said):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(SetupError) as refused:
        optimizer_values(make(list(model.parameters())), model)
    assert said in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.heavy
def test_a_compiled_model_on_the_cpu_is_estimated_as_compiled():
    """A torch.compile'd module (OptimizedModule) on the CPU is traced as Inductor compiles it (--compile): the same
    tensors as the eager MLP here (Inductor saves what eager saves for Linear and ReLU), and what compiling adds
    to the process."""
    import integration_models as models

    from trainmem.trace.compiled import MIN_TORCH, traceable_here

    if not traceable_here():
        pytest.skip(f"--compile needs torch >= {MIN_TORCH}: a compiled model is estimated as the eager one here")
    model = models.mlp()
    compiled = torch.compile(model)
    optimizer = torch.optim.Adam(model.parameters())
    eager, traced = check(model, optimizer, torch.randn(32, 64)), check(compiled, optimizer, torch.randn(32, 64))
    assert traced.estimate.setup.compile and not eager.estimate.setup.compile
    assert traced.estimate.tensor_bytes == eager.estimate.tensor_bytes
    assert traced.estimate.process_parts["runtime_compile"] > 0
    assert any(line.startswith("--compile:") for line in traced.estimate.warnings)


def test_a_compiled_model_on_a_gpu_is_estimated_as_the_module_it_wraps_and_says_so():
    from trainmem.frontends import ModelSource
    from trainmem.integrations.live import _compiled

    values, source = _compiled({"batch_size": 8}, ModelSource(ref="", name="m", build=lambda: None), "cuda:0")
    assert "compile" not in values
    assert any("torch.compile'd" in note and "Triton" in note for note in source.notes)


def test_the_room_on_this_machines_gpu_is_free_plus_what_the_process_holds(monkeypatch):
    from types import SimpleNamespace

    from trainmem.devices import get_device
    from trainmem.fit import default_margin
    from trainmem.integrations.guard import room_on

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (30 << 30, 40 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 2 << 30)
    planned = SimpleNamespace(device=get_device("a100-40gb"), process_parts={"cuda_context": 500 << 20})
    room, kept = room_on("cuda:0", planned, None)
    assert room == (30 << 30) + (2 << 30) + (500 << 20)
    assert kept == int(planned.device.capacity_bytes * default_margin(planned.device).fraction)
    assert room_on("a100-40gb", planned, 0.0) == (planned.device.capacity_bytes, 0)


def test_a_batch_without_a_batch_dimension_is_refused():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(SetupError, match="expected a batch of tensors whose first dimension is the batch"):
        check(model, torch.optim.SGD(model.parameters(), lr=0.1), {"x": 3})


@pytest.mark.heavy
def test_hf_trainer_callback_in_a_real_trainer(tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    from trainmem.integrations.hf_trainer import MemoryCheckCallback
    import integration_models as models

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, index):
            return {"input_ids": torch.zeros(models.SEQ, dtype=torch.long),
                    "labels": torch.zeros(models.SEQ, dtype=torch.long)}

    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2,
                                          report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
                                          disable_tqdm=True)
    callback = MemoryCheckCallback()
    trainer = transformers.Trainer(model=models.tiny_gpt2_model(), args=args, train_dataset=Tokens(),
                                   callbacks=[callback])
    with caplog.at_level(logging.INFO, logger="trainmem"):
        trainer.train()
    assert any("training at batch 4 fits on cpu" in record.message for record in caplog.records)
    impl = str(trainer.optimizer.optimizer.defaults.get("fused") and "fused" or "default")
    reference = trainmem.estimate(factory("tiny_gpt2"), batch_size=4, hf_trainer=True, optimizer="adamw",
                                  optimizer_impl=impl, max_grad_norm=1.0)
    same_figures(callback.check.estimate, reference)
    assert any("transformers" in key for key in library_parts(callback.check.estimate))


@pytest.mark.heavy
def test_lightning_callback_in_a_real_trainer(caplog):
    lightning = pytest.importorskip("lightning")
    from trainmem.integrations.lightning import MemoryCheck
    import integration_models as models

    class Classifier(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 32
            self.net = models.mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Samples(), batch_size=self.batch_size, shuffle=True)

    class Samples(torch.utils.data.Dataset):  # a million samples, made when read
        def __len__(self):
            return 1 << 20

        def __getitem__(self, index):
            return torch.zeros(64), 0

    def run(callback):
        trainer = lightning.Trainer(max_steps=2, accelerator="cpu", callbacks=[callback], logger=False,
                                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        module = Classifier()
        with caplog.at_level(logging.INFO, logger="trainmem"):
            trainer.fit(module)
        return module

    checked = MemoryCheck()
    run(checked)
    assert checked.check.fits and str(checked.check.estimate.setup.loop) == "lightning"
    assert any("lightning" in key for key in library_parts(checked.check.estimate))
    same_figures(checked.check.estimate, trainmem.estimate(factory("classifier_step"), batch_size=32,
                                                           optimizer="adamw", loop="lightning"))
    planned = "custom:capacity=600MiB,cc=8.0"
    picked = MemoryCheck(device=planned, pick_batch_size=True)
    module = run(picked)
    best = trainmem.fit(factory("classifier_step"), device=planned, optimizer="adamw", loop="lightning",
                        limit=1 << 20).best
    assert picked.batch_size == module.batch_size == best and 1 < best < 1 << 20
    assert picked.check.fits and picked.check.batch_size == best


def test_trainer_arguments_that_are_not_read_yet_are_refused():
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from trainmem.integrations.hf_trainer import trainer_values

    args = SimpleNamespace(deepspeed=None, fsdp="full_shard", gradient_accumulation_steps=1, max_grad_norm=1.0,
                           bf16=False, fp16=False, world_size=1, ddp_bucket_cap_mb=None)
    with pytest.raises(SetupError, match="expected a single-device Trainer run"):
        trainer_values(args)
    args.fsdp, args.bf16 = "", True
    assert trainer_values(args) == {"hf_trainer": True, "grad_accum": 1, "max_grad_norm": 1.0,
                                    "precision": "bf16-mixed"}
    args.world_size, args.ddp_bucket_cap_mb = 4, 50  # torchrun with 4 processes: the Trainer's DDP
    assert trainer_values(args)["strategy"] == "ddp" and trainer_values(args)["world_size"] == 4
    assert trainer_values(args)["ddp_bucket_mb"] == 50.0


def test_lightning_strategies_read_as_trainmem_layouts():
    lightning = pytest.importorskip("lightning")
    from trainmem.integrations.lightning import strategy_values

    def trainer(**options):
        return lightning.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, **options)

    assert strategy_values(trainer(devices=1)) == {}
    ddp = lightning.pytorch.strategies.DDPStrategy(bucket_cap_mb=10, gradient_as_bucket_view=True)
    assert strategy_values(trainer(devices=2, strategy=ddp)) == {"strategy": "ddp", "world_size": 2,
                                                                 "ddp_bucket_mb": 10.0, "gradient_as_bucket_view": True}
    from types import SimpleNamespace

    class FSDPStrategy:  # Lightning's (FSDP1) needs a GPU to be made at all; its name is what is refused
        pass

    with pytest.raises(SetupError, match="expected one device or DDP, got FSDPStrategy"):
        strategy_values(SimpleNamespace(strategy=FSDPStrategy(), world_size=2))


@pytest.mark.heavy
def test_lightning_bf16_true_trains_on_the_batch_cast_as_the_trainer_casts_it():
    lightning = pytest.importorskip("lightning")
    from trainmem.integrations.lightning import MemoryCheck
    import integration_models as models

    class Classifier(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = models.mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

    data = torch.utils.data.TensorDataset(torch.randn(64, 64), torch.zeros(64, dtype=torch.long))
    checked = MemoryCheck()
    trainer = lightning.Trainer(max_steps=1, accelerator="cpu", precision="bf16-true", callbacks=[checked],
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False)
    trainer.fit(Classifier(), torch.utils.data.DataLoader(data, batch_size=16))
    assert str(checked.check.estimate.setup.precision) == "bf16" and checked.check.fits


@pytest.mark.heavy
def test_lightning_manual_optimization_is_refused_before_a_step():
    lightning = pytest.importorskip("lightning")
    from trainmem.integrations.lightning import MemoryCheck
    import integration_models as models

    steps = []

    class Manual(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.net = models.mlp()

        def training_step(self, batch, batch_idx):
            steps.append(batch_idx)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(8, 64), torch.zeros(8, dtype=torch.long))
    trainer = lightning.Trainer(max_steps=1, accelerator="cpu", callbacks=[MemoryCheck()], logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(SetupError, match="expected automatic optimization"):
        trainer.fit(Manual(), torch.utils.data.DataLoader(data, batch_size=4))
    assert steps == []


@pytest.mark.tf
def test_keras_callback_in_a_real_fit(caplog):
    keras = pytest.importorskip("keras")
    import numpy as np

    from trainmem.integrations.keras import MemoryCheck, check as keras_check

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = np.zeros((256, 64), "float32"), np.zeros(256, "int64")
    callback = MemoryCheck(batch_size=64)
    with caplog.at_level(logging.INFO, logger="trainmem"):
        model.fit(x, y, batch_size=64, epochs=1, steps_per_epoch=2, callbacks=[callback], verbose=0)
    assert callback.check.estimate.setup.optimizer == "momentum"
    same_figures(callback.check.estimate, keras_check(model, x, 64).estimate)
    same_figures(callback.check.estimate, trainmem.estimate(model, batch_size=64, optimizer="momentum"))


def _checked_as_trainer(model, optimizer, trainer: str) -> None:
    """check() of a trainer-prepared MLP at bf16-mixed equals the factory estimate with that --trainer."""
    verdict = check(model, optimizer, torch.randn(256, 64))
    assert verdict.estimate.setup.trainer == trainer and str(verdict.estimate.setup.precision) == "bf16-mixed"
    same_figures(verdict.estimate, trainmem.estimate(factory("mlp_factory"), batch_size=256, optimizer="adam",
                                                     optimizer_impl="foreach", trainer=trainer,
                                                     precision="bf16-mixed"))


def test_a_fabric_prepared_model_is_estimated_as_fabric_runs_it():
    """fabric.setup's _FabricModule: the module inside, `--trainer fabric` at the plugin's precision. Before, its
    forward ran in the trace with Fabric's hook, which refuses a plain backward: the check failed."""
    lightning = pytest.importorskip("lightning")
    import integration_models as models

    fabric = lightning.Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
    model = models.mlp()
    model, optimizer = fabric.setup(model, torch.optim.Adam(model.parameters(), foreach=True))
    _checked_as_trainer(model, optimizer, "fabric")


def test_an_accelerate_prepared_model_is_estimated_as_accelerate_runs_it_and_its_wrapper_is_not_doubled():
    """accelerator.prepare leaves the module with Accelerate's forward (fp32 copies of autocast's outputs): the copy
    traced is the plain module under `--trainer accelerate`, whose figures it equals; traced with Accelerate's own
    forward on top, each output would be copied twice. The real model is left as it was."""
    accelerate = pytest.importorskip("accelerate")
    import integration_models as models
    from accelerate.state import AcceleratorState

    # the process-wide state fixes the precision of the first Accelerator made (transformers' Trainer makes one):
    # reset before and after, so that neither this test nor a later one meets another's precision
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        accelerator = accelerate.Accelerator(cpu=True, mixed_precision="bf16")
        model = models.mlp()
        model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), foreach=True))
        _checked_as_trainer(model, optimizer, "accelerate")
        assert "forward" in model.__dict__ and all(p.grad is None and p.device.type == "cpu" for p in model.parameters())
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_a_fabric_precision_trainmem_does_not_model_is_refused_in_one_line():
    lightning = pytest.importorskip("lightning")
    import integration_models as models

    model = lightning.Fabric(accelerator="cpu", devices=1, precision="64-true").setup(models.mlp())
    with pytest.raises(SetupError, match="expected a Fabric precision trainmem models .*got '64-true'"):
        check(model, None, torch.randn(8, 64))
