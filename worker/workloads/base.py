"""``Workload``: what every workload shares (precision, optimizer, the training step's
sub-phases, evaluation, export, generation with a KV cache), and the hooks a workload supplies.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memsweep.conf.contract import RunSpec

from .compile import compile_model, compiler_missing
from .errors import DependencyMissing
from .optimizers import check_optimizer, make_optimizer

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view is counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        storage = t.untyped_storage()
        # the StorageImpl's address: a fake tensor's (dry run) has no data pointer
        key = (storage.device, storage._cdata, storage.nbytes())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


class Workload:
    """The phase bodies of one run; a subclass supplies the model-specific hooks.

    Training step, per micro-step m of ``spec.micro_steps``: ``step_forward(m)`` (zero_grad
    with set_to_none at m = 0, then the forward pass), ``step_loss(m)`` (the loss, divided by
    micro_steps; the model output is released), ``step_backward(m)``; then
    ``step_optimizer()``, after which the loss is released. Generation: ``gen_prefill()`` (the
    ``context`` prompt tokens, KV
    cache created) then ``gen_decode()`` (``new_tokens`` forward passes of one token, greedy),
    under ``torch.inference_mode``; ``end_generation()`` releases the cache between phases.

    Every phase body takes no argument and returns None (the worker's phase plan calls it); the
    sizes a phase adds to its record (``gradient_bytes``, ``optimizer_state_bytes``,
    ``kv_cache_info``, ``export_info``) are bytes by construction, not counters.

    Args:
        spec: the run's spec.
        device: the run's device.
        run_dir: the run directory (the export phase writes its temporary file there); None
            means the system's temporary directory.
    """

    name = "?"
    # True: build in float32 on the host, then move and cast (the mlp's loading:
    # model_load briefly holds both copies); False: build directly on the device in its dtype.
    build_on_host = False

    def __init__(self, spec: RunSpec, device: torch.device, run_dir: Path | None = None):
        self.spec, self.device = spec, device
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.gettempdir())
        self.compute_dtype = DTYPES[spec.dtype]
        self.autocast_on = spec.precision == "autocast"
        self.param_dtype = torch.float32 if self.autocast_on else self.compute_dtype
        self.model: nn.Module | None = None
        # memsweep's optimizer, or whatever the user's factory returned for the user's own train_step
        # (a list, tuple or dict of optimizers): ``optimizers()`` lists the optimizers in it
        self.optimizer: Any = None
        self.scaler: torch.amp.GradScaler | None = None
        self.x: Any = None  # the run's inputs (see make_inputs)
        self.target: Any = None
        self._out: Any = None
        self._loss: torch.Tensor | None = None
        self.cache: Any = None
        self._next_token: torch.Tensor | None = None
        self.cache_tokens = 0
        self.export_bytes: int | None = None

    # ----- hooks of a workload --------------------------------------------------------------
    def prepare(self) -> None:
        """Import what the spec needs (before any phase).

        Raises:
            DependencyMissing: an optional package the spec needs is not installed, or
                torch.compile's backend cannot run here (``compile.compiler_missing``).
        """
        if self.spec.mode == "train":
            check_optimizer(self.spec.optimizer)
        if self.spec.compile != "false":
            missing = compiler_missing(self.device.type)
            if missing:
                raise DependencyMissing(f"compile={self.spec.compile}: {missing}")

    def move_model(self, model: nn.Module) -> None:
        """Place the built model on the run's device in the parameter dtype (``Module.to``)."""
        model.to(device=self.device, dtype=self.param_dtype)

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """The model that runs, from the one built and placed (the hf workload adds LoRA adapters)."""
        return model

    def build_optimizer(self, params: list[torch.Tensor], foreach: bool | None) -> torch.optim.Optimizer:
        """The optimizer of ``spec.optimizer`` over the trainable ``params`` (``make_optimizer``)."""
        return make_optimizer(self.spec.optimizer, params, foreach=foreach)

    def build_model(self) -> nn.Module:
        """The model with random weights (called under the parameter dtype as default dtype,
        and on the device unless ``build_on_host``)."""
        raise NotImplementedError

    def make_inputs(self, batch: int, generator: torch.Generator | None, with_target: bool) -> tuple[Any, Any]:
        """(inputs, target) for ``batch``, drawn from ``generator`` (None on a fake-CUDA dry run);
        target None when not ``with_target``."""
        raise NotImplementedError

    def call(self, inputs: Any) -> Any:
        """The model's output for ``inputs`` (``model(inputs)``)."""
        return self._built_model()(inputs)

    def loss_fn(self, output: Any, target: Any) -> torch.Tensor:
        """The scalar training loss of ``output`` against ``target``."""
        raise NotImplementedError

    def enable_checkpointing(self, model: nn.Module) -> None:
        """Turn on activation checkpointing (spec ``checkpointing``) in ``model``.

        Raises:
            ValueError: the model cannot checkpoint (subclasses).
        """
        # nn.Module.__setattr__ is typed for tensors and modules only (torch's stubs); a plain flag is fine
        model.checkpointing = True  # type: ignore[assignment]

    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(logits of the last position (batch, 1, vocab), cache) for prompt ids (batch, context)."""
        raise NotImplementedError

    def decode(self, token: torch.Tensor, cache: Any, position: int) -> tuple[torch.Tensor, Any]:
        """(logits (batch, 1, vocab), cache) for one token (batch, 1) at ``position``."""
        raise NotImplementedError

    def cache_tensors(self, cache: Any) -> list[torch.Tensor]:
        """The tensors of a KV cache, for ``kv_cache_info``."""
        raise NotImplementedError

    def model_info(self) -> dict[str, Any]:
        """Sizes by construction (not counters), for the record: parameters and their bytes."""
        model = self._built_model()
        params = list(model.parameters())
        trainable = [p for p in params if p.requires_grad]
        frozen = [p for p in params if not p.requires_grad]
        return {
            "parameters": sum(p.numel() for p in params),
            "trainable_parameters": sum(p.numel() for p in trainable),
            "frozen_parameters": sum(p.numel() for p in frozen),
            "parameter_bytes": _storage_bytes(params),
            "trainable_parameter_bytes": _storage_bytes(trainable),
            "frozen_parameter_bytes": _storage_bytes(frozen),
            "compile": self.spec.compile,
            "buffer_bytes": _storage_bytes(model.buffers()),
            "param_dtype": str(self.param_dtype).replace("torch.", ""),
            "compute_dtype": str(self.compute_dtype).replace("torch.", ""),
        }

    # ----- helpers --------------------------------------------------------------------------
    def _built_model(self) -> nn.Module:
        """The model ``model_load`` built (a phase before model_load is a programming error)."""
        assert self.model is not None, "model_load has not run"
        return self.model

    def _built_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer ``model_load`` built in train mode (only memsweep's own train phases ask for it)."""
        assert isinstance(self.optimizer, torch.optim.Optimizer), "model_load has not run in train mode"
        return self.optimizer

    def optimizer_items(self) -> list[Any]:
        """What ``self.optimizer`` holds: itself, or the items of the list or tuple (the values of
        the dict) the user's factory returned for the user's own train_step; empty before
        model_load and outside train mode."""
        held = self.optimizer
        if held is None:
            return []
        return (
            list(held.values()) if isinstance(held, dict) else list(held) if isinstance(held, (list, tuple)) else [held]
        )

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The torch optimizers among ``optimizer_items()``."""
        return [o for o in self.optimizer_items() if isinstance(o, torch.optim.Optimizer)]

    def autocast(self):
        """``torch.autocast`` to the compute dtype under precision=autocast, else a null context."""
        if self.autocast_on:
            return torch.autocast(self.device.type, dtype=self.compute_dtype)
        return contextlib.nullcontext()

    def generator(self, offset: int) -> torch.Generator | None:
        """A seeded generator on the run's device; None on a dry run on a non-CPU device (fake
        tensors hold no values, and a CUDA generator would need the CUDA runtime)."""
        if self.spec.dry_run and self.device.type != "cpu":
            return None
        return torch.Generator(device=self.device).manual_seed(self.spec.seed + offset)

    # ----- phase bodies ---------------------------------------------------------------------
    def model_load(self) -> None:
        """Build the model with random weights directly on the device in its dtype; in train
        mode also the optimizer (whose states appear in the first step) and checkpointing."""
        torch.manual_seed(self.spec.seed)
        if self.build_on_host:
            model = self.build_model()
        else:
            # On an accelerator the weights are created there directly; the CPU is the default device.
            on_device = self.device if self.device.type != "cpu" else contextlib.nullcontext()
            with _default_dtype(self.param_dtype), on_device:
                model = self.build_model()
        self.move_model(model)  # (a dry run's fake modules: worker.counters.fake.install_fake_module_apply)
        model = self.adapt_model(model)
        self.model = model
        if self.spec.mode == "train":
            model.train()
            if self.spec.checkpointing:
                self.enable_checkpointing(model)
        if self.spec.compile != "false":  # lazy: compiled at the first call, in the cold phase
            self.model = compile_model(model, self.spec.compile)
        if self.spec.mode == "train":
            # a CUDA dry run: the foreach optimizer the GPU would run by default (make_optimizer);
            # not Adafactor's, which reads a tensor's value (.item()) that fake tensors do not have
            foreach = (
                True
                if (self.spec.dry_run and self.device.type == "cuda" and self.spec.optimizer in ("adamw", "sgd"))
                else None
            )
            self.optimizer = self.build_optimizer([p for p in model.parameters() if p.requires_grad], foreach)
            if self.autocast_on and self.compute_dtype == torch.float16:
                self.scaler = torch.amp.GradScaler(self.device.type)
        else:
            model.eval()

    def inputs(self) -> None:
        """The inputs phase: the run's inputs (and a target in train mode) at ``spec.batch``."""
        self.x, self.target = self.make_inputs(self.spec.batch, self.generator(1), self.spec.mode == "train")

    def forward(self) -> None:
        """One inference forward pass (inference mode's cold_forward, warmup, warm_forward)."""
        with torch.inference_mode(), self.autocast():
            out = self.call(self.x)
        del out

    def step_forward(self, micro: int = 0) -> None:
        """The forward sub-phase of micro-step ``micro`` (zero_grad(set_to_none=True) first at 0)."""
        if micro == 0:
            self._built_optimizer().zero_grad(set_to_none=True)
        with self.autocast():
            self._out = self.call(self.x)

    def step_loss(self, micro: int = 0) -> None:
        """The loss sub-phase: the loss (divided by ``micro_steps``); the output is released."""
        with self.autocast():
            loss = self.loss_fn(self._out, self.target)
        self._out = None
        if self.spec.micro_steps > 1:
            loss = loss / self.spec.micro_steps
        self._loss = loss

    def step_backward(self, micro: int = 0) -> None:
        """The backward sub-phase (through the GradScaler under float16 autocast)."""
        loss = self._loss
        assert loss is not None, "step_loss has not run"
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step_optimizer(self) -> None:
        """The optimizer step; the last loss is released after it (``del loss`` at the end of
        the step; a next micro-step's loss replaces the previous one)."""
        optimizer = self._built_optimizer()
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        self._loss = None

    def user_step(self) -> None:
        """The user's own whole training step (``workload.train_step``, one sub-phase
        ``USER_STEP_SUB_PHASES``); only the user workload has one."""
        raise NotImplementedError

    def train_step(self) -> None:
        """One whole training step, micro-steps included (the warmup's unit)."""
        if self.spec.train_step == "user":
            self.user_step()
            return
        for micro in range(self.spec.micro_steps):
            self.step_forward(micro)
            self.step_loss(micro)
            self.step_backward(micro)
        self.step_optimizer()

    def gen_prefill(self) -> None:
        """The prefill sub-phase: the ``context`` prompt tokens through the model, KV cache created."""
        self.end_generation()
        with torch.inference_mode(), self.autocast():
            logits, self.cache = self.prefill(self.x)
            self._next_token = logits[:, -1].argmax(-1, keepdim=True)
        self.cache_tokens = self.spec.context

    def gen_decode(self) -> None:
        """The decode sub-phase: ``new_tokens`` greedy one-token forward passes on the cache."""
        with torch.inference_mode(), self.autocast():
            for i in range(self.spec.new_tokens):
                token = self._next_token
                assert token is not None, "gen_prefill has not run"
                logits, self.cache = self.decode(token, self.cache, self.spec.context + i)
                self._next_token = logits[:, -1].argmax(-1, keepdim=True)
                self.cache_tokens += 1

    def end_generation(self) -> None:
        """Release the KV cache and the next token (between phases)."""
        self.cache = self._next_token = None

    def generate(self) -> None:
        """One whole generation, prefill and decode (the warmup's unit)."""
        self.gen_prefill()
        self.gen_decode()
        self.end_generation()

    def evaluate(self) -> None:
        """The eval phase: eval mode, no_grad, a forward pass and the loss at eval_batch,
        inputs created inside the phase; the model returns to train mode after."""
        model = self._built_model()
        eval_batch = self.spec.eval_batch
        assert eval_batch is not None, "the spec resolves eval_batch when the eval phase is asked for"
        model.eval()
        try:
            with torch.no_grad(), self.autocast():
                x, target = self.make_inputs(eval_batch, self.generator(2), True)
                out = self.call(x)
                loss = self.loss_fn(out, target)
                del out, loss, x, target
        finally:
            model.train()

    def export(self) -> None:
        """The export phase: torch.save of the state dict to a temporary file in the run
        directory (not /tmp, which may be memory-backed), deleted afterwards."""
        fd, tmp = tempfile.mkstemp(prefix=".export-", suffix=".pt", dir=self.run_dir)
        os.close(fd)
        try:
            torch.save(self._built_model().state_dict(), tmp)
            self.export_bytes = os.path.getsize(tmp)
        finally:
            os.unlink(tmp)

    # ----- what a phase adds to its record (sizes by construction, bytes) -------------------
    def storage_roles(self) -> list[tuple[str, list[torch.Tensor]]]:
        """The tensors of each role, for splitting a dry run's phase peak (worker.counters
        PEAK_CATEGORIES): ("parameter", the model's parameters), ("gradient", their ``.grad``),
        ("optimizer_state", every tensor in the optimizer's state, ``step`` counters included).
        Empty before model_load; buffers, inputs and caches have no role here."""
        if self.model is None:
            return []
        params: list[torch.Tensor] = list(self.model.parameters())
        roles: list[tuple[str, list[torch.Tensor]]] = [
            ("parameter", params),
            ("gradient", [p.grad for p in params if p.grad is not None]),
        ]
        if self.optimizer is not None:
            roles.append(("optimizer_state", self._state_tensors()))
        return roles

    def _state_tensors(self) -> list[torch.Tensor]:
        """Every tensor in the state of the run's optimizers (``optimizers()``)."""
        return [
            v
            for optimizer in self.optimizers()
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ]

    def gradient_bytes(self) -> dict[str, int]:
        """``{"gradient_bytes": bytes}`` of the parameters' ``.grad`` storages."""
        grads = (p.grad for p in self._built_model().parameters() if p.grad is not None)
        return {"gradient_bytes": _storage_bytes(grads)}

    def optimizer_state_bytes(self) -> dict[str, int | None]:
        """Bytes of the optimizers' state tensors on the run's device (AdamW keeps its ``step``
        counters on the host when the parameters are on CUDA); null (unknown, never zero) when
        ``optimizer_items()`` holds something other than torch optimizers, whose state memsweep
        cannot read, or nothing at all (a user's factory that returned None or an empty
        collection: there is no optimizer state to read, which is not 0 bytes of it)."""
        optimizers = self.optimizers()
        if not optimizers or len(optimizers) != len(self.optimizer_items()):
            return {"optimizer_state_bytes": None}
        tensors = [v for v in self._state_tensors() if v.device.type == self.device.type]
        return {"optimizer_state_bytes": _storage_bytes(tensors)}

    def step_sizes(self) -> dict[str, int | None]:
        """``gradient_bytes`` and ``optimizer_state_bytes`` together: what the user's whole step
        (one sub-phase) leaves live, by construction (bytes)."""
        return {**self.gradient_bytes(), **self.optimizer_state_bytes()}

    def kv_cache_info(self) -> dict[str, int]:
        """``{"kv_cache_bytes": bytes of the cache's storages, "kv_cache_tokens": tokens in it}``."""
        tensors: list[torch.Tensor] = self.cache_tensors(self.cache) if self.cache is not None else []
        return {"kv_cache_bytes": _storage_bytes(tensors), "kv_cache_tokens": self.cache_tokens}

    def export_info(self) -> dict[str, int | None]:
        """``{"export_bytes": bytes of the file the export phase wrote}`` (None before it ran)."""
        return {"export_bytes": self.export_bytes}
