"""Workloads: a model, its inputs and its loss, and the bodies of every phase of every mode.

``Workload`` holds what is common to all workloads (precision, optimizer, the training
step's sub-phases, evaluation, export, generation with a KV cache); each subclass supplies
the model-specific hooks: ``build_model``, ``make_inputs``, ``call``, ``loss_fn`` and, for
generation, ``prefill`` / ``decode``.

Built-in workloads (random weights, nothing is downloaded):

* ``mlp``, the seed's small dense network: inputs x (batch, context, width); ``depth``
  blocks Linear(width -> hidden) -> activation -> Linear(hidden -> width); training loss:
  mean squared error against a random target of the same shape.
* ``transformer``: the decoder-only LM of ``worker.models`` on token ids (batch, context);
  loss: next-token cross-entropy on float32 logits (batch * context, vocab).
* ``hf``: a ``transformers`` causal LM built from a config (``pip install 'memsweep[hf]'``);
  same inputs and loss as ``transformer``.
* ``user``: the user's own functions, named by dotted path (``_target_``, as in Hydra):
  ``model(load, **kwargs) -> nn.Module``, ``inputs(load, **kwargs) -> (inputs, target)`` and
  optionally ``loss(output, target, **kwargs) -> scalar tensor``; ``load`` is a ``Load``.

The worker imports torch and the standard library only; ``transformers`` (hf),
``bitsandbytes`` (optimizer=adamw8bit) and the user's modules are imported by ``prepare``,
before the first phase, only when the spec asks for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from conf.contract import RunSpec, hf_config_kind

from .models import MLP, KVCache, Transformer

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class DependencyMissing(RuntimeError):
    """An optional package the spec needs is not installed (nothing was measured)."""


@dataclasses.dataclass(frozen=True)
class Load:
    """What a user workload's functions receive: the load of this run.

    ``dtype`` is the dtype of the weights and of floating-point inputs (float32 under
    precision=autocast), ``compute_dtype`` the spec's dtype. ``generator`` is a seeded
    ``torch.Generator`` on ``device``, for reproducible random inputs (None on a dry run on a
    CUDA device: fake tensors hold no values). ``batch`` is the batch
    of this call (``eval_batch`` for the eval phase). ``devices``: how many devices the run
    uses (spec ``devices``): a data-parallel load spreads over cuda:0 .. cuda:devices-1
    (``device`` is cuda:0 then), e.g. ``torch.nn.DataParallel(model, device_ids=range(devices))``.
    """

    batch: int
    context: int
    width: int
    dtype: torch.dtype
    compute_dtype: torch.dtype
    device: torch.device
    mode: str
    seed: int
    generator: torch.Generator | None = None
    devices: int = 1


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


def _convert_fake(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """``model.to(device=device, dtype=dtype)`` for a model of fake tensors (dry run).

    ``nn.Module._apply`` swaps fake parameters in place (``torch.utils.swap_tensors``), which
    fails on tensors FakeTensorMode holds weak references to; here a converted parameter or
    buffer replaces the old one in its module instead. The bytes are those of ``Module.to``:
    a parameter already in that dtype and device is kept (no copy), another one is copied and
    the old storage released once nothing refers to it.
    """
    for module in model.modules():
        for key, param in list(module._parameters.items()):
            if param is None:
                continue
            with torch.no_grad():
                applied = param.to(device=device, dtype=dtype if param.is_floating_point() else None)
            if applied is not param:
                module._parameters[key] = nn.Parameter(applied, requires_grad=param.requires_grad)
        for key, buf in list(module._buffers.items()):
            if buf is None:
                continue
            applied = buf.to(device=device, dtype=dtype if buf.is_floating_point() else None)
            if applied is not buf:
                module._buffers[key] = applied


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: logits (batch, tokens, vocab), target (batch, tokens) int64.

    The logits are upcast to float32 first, as Hugging Face's causal-LM loss does
    (transformers ``ForCausalLMLoss``): a (batch * tokens, vocab) float32 copy.
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


def default_loss(output: Any, target: Any) -> torch.Tensor:
    """The user workload's loss when none is given.

    A scalar output is the loss itself (a model that computes its own); with an integer
    target, cross-entropy of output (..., classes) against target (...); with a floating
    target, mean squared error; without a target, mean(output ** 2), a stand-in that makes
    backward reach every parameter the output depends on.
    """
    if isinstance(output, (tuple, list)):
        output = output[0]
    if isinstance(output, dict):
        output = output["loss"] if "loss" in output else next(iter(output.values()))
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"the model returned {type(output).__name__}: give workload.loss to turn it into a scalar")
    if output.dim() == 0:
        return output
    if target is None:
        return output.float().pow(2).mean()
    if not target.is_floating_point():
        return lm_loss(output, target)
    return F.mse_loss(output, target)


def make_optimizer(name: str, params, foreach: bool | None = None) -> torch.optim.Optimizer:
    """The optimizer of ``spec.optimizer``, at its library defaults.

    adamw: torch.optim.AdamW (two states per parameter, exp_avg and exp_avg_sq, in the
    parameter's dtype); sgd: torch.optim.SGD(lr=1e-3), no momentum, no state; adafactor:
    torch.optim.Adafactor (PyTorch >= 2.5; factored second moment); adamw8bit:
    bitsandbytes.optim.AdamW8bit (states quantised to 8 bits). States are allocated lazily,
    in the first optimizer step.

    ``foreach``: passed to the torch optimizers (adamw, sgd, adafactor); None keeps their
    default, which is the foreach implementation when every parameter is a plain CUDA tensor
    (torch.optim.optimizer._default_to_fused_or_foreach). Fake tensors are not plain tensors,
    so a CUDA dry run passes True to run what the GPU runs (foreach temporaries included), for
    adamw and sgd (Adafactor's foreach step reads a value, which fake tensors cannot give).

    Raises:
        DependencyMissing: adafactor on a PyTorch without it; adamw8bit without bitsandbytes.
    """
    check_optimizer(name)
    kw = {} if foreach is None else {"foreach": foreach}
    if name == "adamw":
        return torch.optim.AdamW(params, **kw)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, **kw)
    if name == "adafactor":
        return torch.optim.Adafactor(params, **kw)
    if name == "adamw8bit":
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params)
    raise ValueError(f"unknown optimizer {name!r}")


def check_optimizer(name: str) -> None:
    """Raise DependencyMissing when the optimizer ``name`` cannot be built here."""
    if name == "adafactor" and not hasattr(torch.optim, "Adafactor"):
        raise DependencyMissing(f"optimizer=adafactor needs torch.optim.Adafactor (PyTorch >= 2.5); "
                                f"this is PyTorch {torch.__version__}")
    if name == "adamw8bit":
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as exc:
            raise DependencyMissing(f"optimizer=adamw8bit needs bitsandbytes, which is not installed "
                                    f"({exc}): pip install bitsandbytes") from None


class Workload:
    """The phase bodies of one run; a subclass supplies the model-specific hooks.

    Training step, per micro-step m of ``spec.micro_steps``: ``step_forward(m)`` (zero_grad
    with set_to_none at m = 0, then the forward pass), ``step_loss(m)`` (the loss, divided by
    micro_steps; the model output is released), ``step_backward(m)``; then
    ``step_optimizer()``, after which the loss is released. Generation: ``gen_prefill()`` (the ``context`` prompt tokens, KV
    cache created) then ``gen_decode()`` (``new_tokens`` forward passes of one token, greedy),
    under ``torch.inference_mode``; ``end_generation()`` releases the cache between phases.
    """

    name = "?"
    # True: build in float32 on the host, then move and cast (the mlp keeps the seed's loading,
    # so model_load briefly holds both copies); False: build directly on the device in its dtype.
    build_on_host = False

    def __init__(self, spec: RunSpec, device: torch.device, run_dir: Path | None = None):
        self.spec, self.device = spec, device
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.gettempdir())
        self.compute_dtype = DTYPES[spec.dtype]
        self.autocast_on = spec.precision == "autocast"
        self.param_dtype = torch.float32 if self.autocast_on else self.compute_dtype
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler = None
        self.x = self.target = None  # the run's inputs (see make_inputs)
        self._out = self._loss = None
        self.cache = None
        self._next_token = None
        self.cache_tokens = 0
        self.export_bytes: int | None = None

    # ----- hooks of a workload --------------------------------------------------------------
    def prepare(self) -> None:
        """Import what the spec needs (before any phase). Raises DependencyMissing."""
        if self.spec.mode == "train":
            check_optimizer(self.spec.optimizer)

    def build_model(self) -> nn.Module:
        raise NotImplementedError

    def make_inputs(self, batch: int, generator: torch.Generator, with_target: bool) -> tuple[Any, Any]:
        """(inputs, target) for ``batch``; target None when not ``with_target``."""
        raise NotImplementedError

    def call(self, inputs: Any) -> Any:
        return self.model(inputs)

    def loss_fn(self, output: Any, target: Any) -> torch.Tensor:
        raise NotImplementedError

    def enable_checkpointing(self, model: nn.Module) -> None:
        model.checkpointing = True

    def prefill(self, ids: torch.Tensor):
        """(logits of the last position (batch, 1, vocab), cache) for prompt ids (batch, context)."""
        raise NotImplementedError

    def decode(self, token: torch.Tensor, cache, position: int):
        """(logits (batch, 1, vocab), cache) for one token (batch, 1) at ``position``."""
        raise NotImplementedError

    def cache_tensors(self, cache) -> list[torch.Tensor]:
        raise NotImplementedError

    def model_info(self) -> dict:
        """Sizes by construction (not counters), for the record: parameters and their bytes."""
        params = list(self.model.parameters())
        return {"parameters": sum(p.numel() for p in params),
                "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
                "parameter_bytes": _storage_bytes(params),
                "buffer_bytes": _storage_bytes(self.model.buffers()),
                "param_dtype": str(self.param_dtype).replace("torch.", ""),
                "compute_dtype": str(self.compute_dtype).replace("torch.", "")}

    # ----- helpers --------------------------------------------------------------------------
    def autocast(self):
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
        if self.spec.dry_run:
            _convert_fake(model, self.device, self.param_dtype)
        else:
            model.to(device=self.device, dtype=self.param_dtype)
        self.model = model
        if self.spec.mode == "train":
            model.train()
            if self.spec.checkpointing:
                self.enable_checkpointing(model)
            # a CUDA dry run: the foreach optimizer the GPU would run by default (make_optimizer);
            # not Adafactor's, which reads a tensor's value (.item()) that fake tensors do not have
            foreach = True if (self.spec.dry_run and self.device.type == "cuda"
                               and self.spec.optimizer in ("adamw", "sgd")) else None
            self.optimizer = make_optimizer(self.spec.optimizer, [p for p in model.parameters() if p.requires_grad],
                                            foreach=foreach)
            if self.autocast_on and self.compute_dtype == torch.float16:
                self.scaler = torch.amp.GradScaler(self.device.type)
        else:
            model.eval()

    def inputs(self) -> None:
        self.x, self.target = self.make_inputs(self.spec.batch, self.generator(1), self.spec.mode == "train")

    def forward(self) -> None:
        """One inference forward pass (inference mode's cold_forward, warmup, warm_forward)."""
        with torch.inference_mode(), self.autocast():
            out = self.call(self.x)
        del out

    def step_forward(self, micro: int = 0) -> None:
        if micro == 0:
            self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            self._out = self.call(self.x)

    def step_loss(self, micro: int = 0) -> None:
        with self.autocast():
            loss = self.loss_fn(self._out, self.target)
        self._out = None
        if self.spec.micro_steps > 1:
            loss = loss / self.spec.micro_steps
        self._loss = loss

    def step_backward(self, micro: int = 0) -> None:
        loss = self._loss
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step_optimizer(self) -> None:
        """The optimizer step; the last loss is released after it (``del loss`` at the end of
        the step, as in the seed's loop; a next micro-step's loss replaces the previous one)."""
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self._loss = None

    def train_step(self) -> None:
        """One whole training step, micro-steps included (the warmup's unit)."""
        for micro in range(self.spec.micro_steps):
            self.step_forward(micro)
            self.step_loss(micro)
            self.step_backward(micro)
        self.step_optimizer()

    def gen_prefill(self) -> None:
        self.end_generation()
        with torch.inference_mode(), self.autocast():
            logits, self.cache = self.prefill(self.x)
            self._next_token = logits[:, -1].argmax(-1, keepdim=True)
        self.cache_tokens = self.spec.context

    def gen_decode(self) -> None:
        with torch.inference_mode(), self.autocast():
            for i in range(self.spec.new_tokens):
                logits, self.cache = self.decode(self._next_token, self.cache, self.spec.context + i)
                self._next_token = logits[:, -1].argmax(-1, keepdim=True)
                self.cache_tokens += 1

    def end_generation(self) -> None:
        self.cache = self._next_token = None

    def generate(self) -> None:
        """One whole generation, prefill and decode (the warmup's unit)."""
        self.gen_prefill()
        self.gen_decode()
        self.end_generation()

    def evaluate(self) -> None:
        """The eval phase: eval mode, no_grad, a forward pass and the loss at eval_batch,
        inputs created inside the phase; the model returns to train mode after."""
        self.model.eval()
        try:
            with torch.no_grad(), self.autocast():
                x, target = self.make_inputs(self.spec.eval_batch, self.generator(2), True)
                out = self.call(x)
                loss = self.loss_fn(out, target)
                del out, loss, x, target
        finally:
            self.model.train()

    def export(self) -> None:
        """The export phase: torch.save of the state dict to a temporary file in the run
        directory (not /tmp, which may be memory-backed), deleted afterwards."""
        fd, tmp = tempfile.mkstemp(prefix=".export-", suffix=".pt", dir=self.run_dir)
        os.close(fd)
        try:
            torch.save(self.model.state_dict(), tmp)
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
        params = list(self.model.parameters())
        roles = [("parameter", params), ("gradient", [p.grad for p in params if p.grad is not None])]
        if self.optimizer is not None:
            roles.append(("optimizer_state", [v for state in self.optimizer.state.values()
                                              for v in state.values() if isinstance(v, torch.Tensor)]))
        return roles

    def gradient_bytes(self) -> dict:
        return {"gradient_bytes": _storage_bytes(p.grad for p in self.model.parameters() if p.grad is not None)}

    def optimizer_state_bytes(self) -> dict:
        """Bytes of the optimizer's state tensors on the run's device (AdamW keeps its ``step``
        counters on the host when the parameters are on CUDA)."""
        tensors = [v for state in self.optimizer.state.values() for v in state.values()
                   if isinstance(v, torch.Tensor) and v.device.type == self.device.type]
        return {"optimizer_state_bytes": _storage_bytes(tensors)}

    def kv_cache_info(self) -> dict:
        tensors = self.cache_tensors(self.cache) if self.cache is not None else []
        return {"kv_cache_bytes": _storage_bytes(tensors), "kv_cache_tokens": self.cache_tokens}

    def export_info(self) -> dict:
        return {"export_bytes": self.export_bytes}


class MlpWorkload(Workload):
    name = "mlp"
    build_on_host = True

    def build_model(self) -> nn.Module:
        s, w = self.spec, self.spec.workload
        hidden = w["hidden"] if w["hidden"] is not None else 4 * s.width
        return MLP(s.width, hidden, w["depth"], w["activation"])

    def make_inputs(self, batch, generator, with_target):
        shape = (batch, self.spec.context, self.spec.width)
        x = torch.randn(shape, device=self.device, dtype=self.param_dtype, generator=generator)
        target = torch.randn(shape, device=self.device, dtype=self.param_dtype, generator=generator) \
            if with_target else None
        return x, target

    def loss_fn(self, output, target):
        return F.mse_loss(output, target)


def transformer_dims(spec: RunSpec) -> dict:
    """The transformer's resolved shape: nulls replaced by their defaults (hidden = width,
    kv_heads = heads, head_dim = hidden / heads, ffn_hidden = 4 * hidden)."""
    w = spec.workload
    hidden = w["hidden"] if w["hidden"] is not None else spec.width
    return {"layers": w["layers"], "hidden": hidden, "heads": w["heads"],
            "kv_heads": w["kv_heads"] if w["kv_heads"] is not None else w["heads"],
            "head_dim": w["head_dim"] if w["head_dim"] is not None else hidden // w["heads"],
            "ffn_hidden": w["ffn_hidden"] if w["ffn_hidden"] is not None else 4 * hidden,
            "vocab": w["vocab"], "attention": w["attention"], "norm": w["norm"], "ffn": w["ffn"],
            "tie_embeddings": w["tie_embeddings"]}


class _TokenWorkload(Workload):
    """Inputs and loss of a causal LM: ids (batch, context) uniform in [0, vocab); target =
    ids shifted left by one (next token); next-token cross-entropy."""

    vocab = 0

    def make_inputs(self, batch, generator, with_target):
        ids = torch.randint(0, self.vocab, (batch, self.spec.context), device=self.device, generator=generator)
        return ids, (torch.roll(ids, -1, dims=1) if with_target else None)

    def loss_fn(self, output, target):
        return lm_loss(output, target)


class TransformerWorkload(_TokenWorkload):
    name = "transformer"

    def __init__(self, spec, device, run_dir=None):
        super().__init__(spec, device, run_dir)
        self.dims = transformer_dims(spec)
        self.vocab = self.dims["vocab"]

    def build_model(self) -> nn.Module:
        return Transformer(**self.dims)

    def prefill(self, ids):
        capacity = self.spec.context + self.spec.new_tokens
        cache = KVCache(self.dims["layers"], self.spec.kv_cache, capacity)
        return self.model(ids, cache, 0, last_only=True), cache

    def decode(self, token, cache, position):
        return self.model(token, cache, position, last_only=True), cache

    def cache_tensors(self, cache):
        return cache.tensors()

    def model_info(self) -> dict:
        return {**super().model_info(), "dims": self.dims}


class HfWorkload(_TokenWorkload):
    """A ``transformers`` causal LM from a config, random weights (AutoModelForCausalLM.from_config).

    ``config``: a config class name (``LlamaConfig(**overrides)``), a model type
    (``AutoConfig.for_model("gpt2", **overrides)``) or a local config.json / directory holding
    one (read as JSON, then ``overrides`` applied). Hub downloads are disabled
    (HF_HUB_OFFLINE=1). Generation passes the cache explicitly: a DynamicCache (created by the
    model at the prefill) or a StaticCache of context + new_tokens tokens.
    """

    name = "hf"

    def prepare(self) -> None:
        super().prepare()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import transformers
        except ImportError as exc:
            raise DependencyMissing(f"workload=hf needs the transformers package, which is not installed ({exc}): "
                                    f"pip install 'memsweep[hf]'") from None
        self.tf = transformers
        self.config = self._config()
        self.vocab = int(self.config.vocab_size)
        limit = getattr(self.config, "max_position_embeddings", None) or getattr(self.config, "n_positions", None)
        tokens = self.spec.context + (self.spec.new_tokens if self.spec.mode == "generate" else 0)
        if isinstance(limit, int) and tokens > limit:
            raise ValueError(f"{tokens} tokens (context{' + new_tokens' if self.spec.mode == 'generate' else ''}) "
                             f"exceed the model's {limit} positions (max_position_embeddings / n_positions); "
                             f"raise it in workload.overrides")

    def _config(self):
        tf, w = self.tf, self.spec.workload
        config, overrides = w["config"], dict(w["overrides"])
        kind = hf_config_kind(config)
        if kind == "class":
            cls = getattr(tf, config, None)
            if cls is None:
                raise ValueError(f"workload.config={config!r}: transformers {tf.__version__} has no such class")
            return cls(**overrides)
        if kind == "model_type":
            return tf.AutoConfig.for_model(config, **overrides)
        path = Path(config).expanduser()
        if path.is_dir():
            path = path / "config.json"
        data = json.loads(path.read_text())
        model_type = data.pop("model_type", None)
        if not model_type:
            raise ValueError(f"workload.config={config!r}: {path} has no model_type")
        data.update(overrides)
        return tf.AutoConfig.for_model(model_type, **data)

    def build_model(self) -> nn.Module:
        dtype_kw = "dtype" if _version(self.tf.__version__) >= (4, 56) else "torch_dtype"  # renamed in 4.56
        return self.tf.AutoModelForCausalLM.from_config(
            self.config, attn_implementation=self.spec.workload["attention"], **{dtype_kw: self.param_dtype})

    def enable_checkpointing(self, model):
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(f"checkpointing=true: {type(model).__name__} does not support gradient checkpointing")
        if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False

    def call(self, inputs):
        return self.model(input_ids=inputs, use_cache=False).logits

    @functools.cached_property
    def _forward_params(self):
        """The model's forward() parameters, read once (not once per decoded token)."""
        return inspect.signature(self.model.forward).parameters

    def _step(self, ids, cache):
        kwargs = {"input_ids": ids, "use_cache": True}
        if cache is not None:
            kwargs["cache" if "cache" in self._forward_params else "past_key_values"] = cache
        if "logits_to_keep" in self._forward_params:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        new_cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
        return out.logits[:, -1:], new_cache

    def prefill(self, ids):
        cache = None
        if self.spec.kv_cache == "static":
            capacity = self.spec.context + self.spec.new_tokens
            params = inspect.signature(self.tf.StaticCache.__init__).parameters
            if "max_batch_size" in params:  # transformers 4.x
                cache = self.tf.StaticCache(config=self.config, max_batch_size=ids.shape[0], max_cache_len=capacity,
                                            device=self.device, dtype=self.compute_dtype)
            else:
                cache = self.tf.StaticCache(config=self.config, max_cache_len=capacity)
        return self._step(ids, cache)

    def decode(self, token, cache, position):
        return self._step(token, cache)

    def cache_tensors(self, cache):
        if isinstance(cache, (tuple, list)):  # legacy format: per layer (key, value)
            return [t for layer in cache for t in layer if isinstance(t, torch.Tensor)]
        layers = getattr(cache, "layers", None)
        if layers is not None:
            return [t for layer in layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                    if isinstance(t, torch.Tensor)]
        return [t for name in ("key_cache", "value_cache") for t in getattr(cache, name, None) or []
                if isinstance(t, torch.Tensor)]

    def model_info(self) -> dict:
        c = self.config
        heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", None)
        hidden = getattr(c, "hidden_size", None) or getattr(c, "n_embd", None)
        dims = {"config_class": type(c).__name__, "model_class": type(self.model).__name__,
                "layers": getattr(c, "num_hidden_layers", None) or getattr(c, "n_layer", None),
                "hidden": hidden, "heads": heads,
                "kv_heads": getattr(c, "num_key_value_heads", None) or heads,
                "head_dim": getattr(c, "head_dim", None) or (hidden // heads if hidden and heads else None),
                "vocab": self.vocab, "attention": self.spec.workload["attention"],
                "transformers": self.tf.__version__}
        return {**super().model_info(), "dims": dims}


def _version(text: str) -> tuple[int, int]:
    parts = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in text.split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def resolve_target(description: dict, field: str):
    """(callable, kwargs) of a ``{_target_: "pkg.module.function", **kwargs}`` description.

    Raises:
        ImportError / AttributeError with a message naming the field and the dotted path.
    """
    path = description["_target_"]
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"{field}._target_={path!r}: cannot import {module_name!r} ({exc}); "
                          f"put its directory in workload.path or on PYTHONPATH") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise AttributeError(f"{field}._target_={path!r}: {module_name} has no callable {attr!r}")
    return fn, {k: v for k, v in description.items() if k != "_target_"}


class UserWorkload(Workload):
    """The user's model, inputs and loss (see the module docstring and the README)."""

    name = "user"

    def prepare(self) -> None:
        super().prepare()
        w = self.spec.workload
        for directory in reversed(w["path"] or []):
            if directory not in sys.path:
                sys.path.insert(0, directory)
        self._model = resolve_target(w["model"], "workload.model")
        self._inputs = resolve_target(w["inputs"], "workload.inputs")
        self._loss_fn = resolve_target(w["loss"], "workload.loss") if w["loss"] else None

    def load(self, batch: int, generator: torch.Generator | None) -> Load:
        s = self.spec
        return Load(batch=batch, context=s.context, width=s.width, dtype=self.param_dtype,
                    compute_dtype=self.compute_dtype, device=self.device, mode=s.mode, seed=s.seed,
                    generator=generator, devices=s.devices)

    def build_model(self) -> nn.Module:
        fn, kwargs = self._model
        model = fn(self.load(self.spec.batch, None), **kwargs)
        if not isinstance(model, nn.Module):
            raise TypeError(f"workload.model {self.spec.workload['model']['_target_']} returned "
                            f"{type(model).__name__}, expected a torch.nn.Module")
        return model

    def make_inputs(self, batch, generator, with_target):
        fn, kwargs = self._inputs
        out = fn(self.load(batch, generator), **kwargs)
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(f"workload.inputs {self.spec.workload['inputs']['_target_']} must return a pair "
                            f"(inputs, target); got {type(out).__name__}")
        return out[0], (out[1] if with_target else None)

    def call(self, inputs):
        if isinstance(inputs, dict):
            return self.model(**inputs)
        if isinstance(inputs, (tuple, list)):
            return self.model(*inputs)
        return self.model(inputs)

    def loss_fn(self, output, target):
        if self._loss_fn is None:
            return default_loss(output, target)
        fn, kwargs = self._loss_fn
        return fn(output, target, **kwargs)

    def enable_checkpointing(self, model):
        enable = getattr(model, "gradient_checkpointing_enable", None)
        if enable is None:
            raise ValueError(f"checkpointing=true: {type(model).__name__} has no gradient_checkpointing_enable(); "
                             "define one (e.g. wrapping blocks in torch.utils.checkpoint.checkpoint)")
        enable()


WORKLOAD_CLASSES = {"mlp": MlpWorkload, "transformer": TransformerWorkload, "hf": HfWorkload,
                    "user": UserWorkload}


def build_workload(spec: RunSpec, device: torch.device, run_dir: Path | None = None) -> Workload:
    try:
        cls = WORKLOAD_CLASSES[spec.workload_name]
    except KeyError:
        raise ValueError(f"unknown workload {spec.workload_name!r}") from None
    return cls(spec, device, run_dir)
