"""The real peers' batch-size finders, each run the way its users run it: one process.

``python -m tests.bench.peers lightning|accelerate LOAD_JSON`` builds the same load as
memsweep's ``mlp`` workload in train mode (``worker.models.MLP``, AdamW at its defaults,
inputs and targets ``randn(batch, context, width)`` float32, MSE loss), emulates the same
CPU capacity as memsweep's worker (``worker.counters.apply_cpu_process_capacity``, memsweep's
``capacity_mode=process``: RLIMIT_DATA =
VmData after the imports + capacity, with the worker's malloc settings set by the caller),
then runs:

* Lightning: ``Tuner(trainer).scale_batch_size(module, mode="binsearch")`` with its defaults
  (init_val=2, max_trials=25, steps_per_trial=3, margin=0.05, max_val=8192), on a
  ``Trainer(accelerator="cpu", devices=1)`` and a DataLoader whose batch size is the
  module's ``batch_size`` (lightning/pytorch/tuner/batch_size_scaling.py);
* Accelerate: ``@find_executable_batch_size(starting_batch_size=128)`` around a training
  loop of ``steps`` steps prepared by ``Accelerator(cpu=True)`` (accelerate/utils/memory.py:
  on an OOM, ``batch_size = int(batch_size * 0.9)`` in accelerate >= 1.x).

Both recognise the CPU allocator's failure, ``RuntimeError("... DefaultCPUAllocator: can't
allocate memory ...")``, as an out-of-memory error. The trials are counted by wrapping the
peer's own per-trial call (Lightning's ``_try_loop_run``, Accelerate's decorated function)
without changing what it does. Prints one JSON line: the answer, the trials (value,
outcome), the wall time of the search and of the whole process.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

T_START = time.perf_counter()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class RandomPairs(Dataset):
    """(x, target), each ``randn(context, width)`` float32, made on demand (no dataset in memory)."""

    def __init__(self, context: int, width: int, length: int = 1 << 20):
        self.context, self.width, self.length = context, width, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return (torch.randn(self.context, self.width, generator=g), torch.randn(self.context, self.width, generator=g))


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(exc)


def build(load: dict):
    from memsweep.worker.models import MLP

    torch.manual_seed(0)
    return MLP(load["width"], 4 * load["width"], load["depth"], "gelu")


def lightning_module(load: dict, batch_size: int):
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = batch_size
            self.model = build(load)

        def training_step(self, batch, batch_idx):
            x, target = batch
            return F.mse_loss(self.model(x), target)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

        def train_dataloader(self):
            return DataLoader(RandomPairs(load["context"], load["width"]), batch_size=self.batch_size)

    return Module()


def lightning_trainer(root: str, **kwargs):
    import lightning.pytorch as pl

    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **kwargs,
    )


def run_lightning(load: dict, trials: list) -> int | None:
    from lightning.pytorch.tuner import Tuner
    from lightning.pytorch.tuner import batch_size_scaling as bss

    module = lightning_module(load, 2)
    original = bss._try_loop_run

    def counted(trainer, params):
        size = module.batch_size
        try:
            original(trainer, params)
        except BaseException as exc:
            trials.append([size, "oom" if is_oom(exc) else type(exc).__name__])
            raise
        trials.append([size, "ok"])

    bss._try_loop_run = counted
    with tempfile.TemporaryDirectory() as root:
        return Tuner(lightning_trainer(root)).scale_batch_size(module, mode="binsearch")


def check_lightning(load: dict, batch_size: int) -> None:
    """One fresh-process training run of ``steps`` steps at ``batch_size`` (Trainer.fit)."""
    with tempfile.TemporaryDirectory() as root:
        lightning_trainer(root, max_steps=load["steps"]).fit(lightning_module(load, batch_size))


def accelerate_loop(accelerator, load: dict, batch_size: int) -> None:
    """``steps`` training steps at ``batch_size``, prepared by ``accelerator``."""
    model = build(load)
    optimizer = torch.optim.AdamW(model.parameters())
    loader = DataLoader(RandomPairs(load["context"], load["width"]), batch_size=batch_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, (x, target) in enumerate(loader):
        loss = F.mse_loss(model(x), target)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step + 1 >= load["steps"]:
            break


def check_accelerate(load: dict, batch_size: int) -> None:
    from accelerate import Accelerator

    accelerate_loop(Accelerator(cpu=True), load, batch_size)


def run_accelerate(load: dict, trials: list) -> int | None:
    from accelerate import Accelerator
    from accelerate.utils import find_executable_batch_size

    accelerator = Accelerator(cpu=True)

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size):
        accelerator.free_memory()
        try:
            accelerate_loop(accelerator, load, batch_size)
        except BaseException as exc:
            trials.append([batch_size, "oom" if is_oom(exc) else type(exc).__name__])
            raise
        trials.append([batch_size, "ok"])
        return batch_size

    return train()


def main(argv: list[str]) -> int:
    """argv: PEER LOAD_JSON [BATCH]; with BATCH, one fresh-process check of the peer's loop."""
    peer, load = argv[0], json.loads(argv[1])
    check = int(argv[2]) if len(argv) > 2 else None
    torch.set_num_threads(load["threads"])
    if peer == "lightning":
        import lightning.pytorch  # noqa: F401  (imports before the limit, as in the worker)
    else:
        import accelerate  # noqa: F401
    from memsweep.worker.counters import apply_cpu_process_capacity

    torch.ones(64, 64) @ torch.ones(64, 64)  # the intra-op thread pool starts before the limit
    apply_cpu_process_capacity(load["capacity_bytes"])
    if check is not None:
        try:
            (check_lightning if peer == "lightning" else check_accelerate)(load, check)
            outcome = "ok"
        except Exception as exc:
            outcome = "oom" if is_oom(exc) else f"{type(exc).__name__}: {str(exc)[:200]}"
        print(json.dumps({"peer": peer, "batch": check, "outcome": outcome}))
        return 0
    trials: list = []
    t0 = time.perf_counter()
    answer, error = None, None
    try:
        answer = (run_lightning if peer == "lightning" else run_accelerate)(load, trials)
    except Exception as exc:  # the peer gave up (e.g. Accelerate reached 0): reported, not hidden
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    search_s = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "peer": peer,
                "answer": answer,
                "trials": trials,
                "error": error,
                "search_s": search_s,
                "process_s": time.perf_counter() - T_START,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
