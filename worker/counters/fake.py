"""Fake tensors of a dry run on a device: the fake mode, the CUDA device guard a CPU-only PyTorch
lacks, and the failures that say an operator cannot run on fake tensors.

Only dry-run worker processes call these (``dryrun.DryRunCounters`` and ``measure``).
"""

from __future__ import annotations

import ctypes
import glob
import os
import weakref

import torch
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode


class NoDeviceInitFakeTensorMode(FakeTensorMode):
    """A FakeTensorMode whose ``avoid_device_init`` is always True (FakeTensorMode sets it only
    when no GPU is visible): see ``fake_mode``."""

    @property
    def avoid_device_init(self) -> bool:
        """Always True: never initialise the device behind a fake tensor."""
        return True


def fake_mode(device_type: str) -> FakeTensorMode:
    """The FakeTensorMode of a dry run on ``device_type``.

    For ``cuda``, a subclass whose ``avoid_device_init`` is always True (FakeTensorMode sets it
    only when no GPU is visible): ``torch.tensor`` constants are never lifted onto the device
    and no constant is propagated across a device move, so a CUDA dry run never touches a real
    GPU, on a machine that has one too (torch/_subclasses/fake_tensor.py, NOTE "torch.tensor,
    lift_fresh, and device movement").

    Args:
        device_type: ``"cpu"`` or ``"cuda"`` (``torch.device.type``).

    Returns:
        A new mode, not entered.
    """
    if device_type != "cuda":
        return FakeTensorMode()
    return NoDeviceInitFakeTensorMode()


_DEVICE_TYPES = 21  # c10::DeviceType: CPU 0, CUDA 1, ..., Lazy 17, ..., PrivateUse1 20 (c10/core/DeviceType.h)
_CUDA, _LAZY = 1, 17


def ensure_fake_cuda_guard() -> str:
    """Make sure PyTorch has a device guard for CUDA, so that fake CUDA tensors can be indexed
    (``t[..., a:b]``, whose binding takes a device guard) without a GPU; returns how (str).

    * a PyTorch built with CUDA has its own guard; without a GPU, FakeTensorMode swaps it for
      PyTorch's no-op ``FakeGuardImpl`` (c10 ``ensureCUDADeviceGuardSet``, done here too):
      ``"pytorch"``;
    * a CPU-only build has none, and ``ensureCUDADeviceGuardSet`` installs the no-op guard only
      over an existing one that reports no device. This puts the Lazy backend's guard (which
      reports none) in the CUDA slot of c10's ``device_guard_impl_registry`` (ctypes), calls
      ``ensureCUDADeviceGuardSet``, which then installs its ``FakeGuardImpl<CUDA>``: the state
      of a CUDA build without a GPU. ``"installed: ..."``. Only dry-run worker processes do this.

    Raises:
        RuntimeError: libc10 or its registry cannot be found, or the no-op guard was not
        installed (the registry is left as it was).
    """
    torch._C._ensureCUDADeviceGuardSet()
    if torch.cuda._is_compiled():
        return "pytorch"
    libs = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.*")))
    if not libs:
        raise RuntimeError("libc10 not found next to torch")
    try:
        registry = (ctypes.c_void_p * _DEVICE_TYPES).in_dll(
            ctypes.CDLL(libs[0]), "_ZN3c104impl26device_guard_impl_registryE"
        )
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"c10 device_guard_impl_registry not found: {exc}") from None
    if registry[_CUDA]:
        return "installed: c10 FakeGuardImpl<CUDA> (already there)"
    if not registry[_LAZY]:
        raise RuntimeError("no Lazy device guard to stand in while the no-op CUDA guard is installed")
    registry[_CUDA] = registry[_LAZY]
    torch._C._ensureCUDADeviceGuardSet()
    if registry[_CUDA] == registry[_LAZY]:
        registry[_CUDA] = None
        raise RuntimeError("ensureCUDADeviceGuardSet did not install its no-op CUDA guard")
    return "installed: c10 FakeGuardImpl<CUDA> (CPU-only PyTorch)"


def fake_cuda_autograd_available() -> bool:
    """Whether autograd can record a graph on fake CUDA tensors in this PyTorch (bool).

    The autograd graph asks the device guard of every CUDA tensor it records for its stream,
    and the backward pass asks for the build's accelerator (autograd engine,
    ``GraphTask::stash_current_streams``). A CPU-only build has no CUDA accelerator: without a
    guard PyTorch aborts the process (C++ terminate, "PyTorch is not linked with support for
    cuda devices", pytorch/pytorch#92627), with the no-op one backward raises "Cannot access
    accelerator device when none is available" (measured with PyTorch 2.13+cpu). So: True for
    a PyTorch built with CUDA (``torch.cuda._is_compiled()``; with or without a GPU, not
    checked here without one), False for a CPU-only build.
    """
    return bool(torch.cuda._is_compiled())


def _converted(old: torch.Tensor, fn) -> torch.Tensor:
    """``fn(old)`` as ``Module._apply`` converts a parameter (under no_grad, its gradient too) or
    a buffer; ``old`` itself when ``fn`` returns it."""
    with torch.no_grad():
        applied = fn(old)
    if applied is old or not isinstance(old, torch.nn.Parameter):
        return applied
    new = torch.nn.Parameter(applied, requires_grad=old.requires_grad)
    if old.grad is not None:
        with torch.no_grad():
            new.grad = fn(old.grad)
    return new


def _replacing_apply(original):
    """``nn.Module._apply`` for modules that hold fake tensors (see ``install_fake_module_apply``)."""
    memo: list[dict[int, tuple]] = []  # old tensor id -> converted one, during one outermost _apply

    def _apply(self, fn, recurse=True):
        outermost = not memo
        if outermost:
            memo.append({})
        try:
            if recurse:
                for module in self.children():
                    module._apply(fn)
            if not any(
                isinstance(t, fake_tensor.FakeTensor) for t in (*self._parameters.values(), *self._buffers.values())
            ):
                return original(self, fn, recurse=False)
            done = memo[-1]
            for table in (self._parameters, self._buffers):
                for key in list(table):  # (not a list of the tensors: each old one is freed in turn)
                    old = table[key]
                    if old is None:
                        continue
                    seen = done.get(id(old))
                    if seen is None or seen[0]() is not old:  # (an id is only reused after a free)
                        seen = (weakref.ref(old), _converted(old, fn))
                        done[id(old)] = seen
                    table[key] = seen[1]
            return self
        finally:
            if outermost:
                memo.pop()

    _apply._memsweep_fake = True  # type: ignore[attr-defined]  # a patch of torch.nn.Module
    return _apply


def install_fake_module_apply() -> bool:
    """Make ``nn.Module.to`` (``.float()``, ``.cuda()``, ... : ``Module._apply``) work on modules
    of fake tensors, for the rest of the process (a dry run's); returns whether it was installed
    now (False: already there).

    Why: ``Module._apply`` always converts a FakeTensor parameter by ``torch.utils.swap_tensors``
    (torch/nn/modules/module.py), and ``swap_tensors`` refuses a tensor that has a weak
    reference. Every fake parameter has one: ``nn.Parameter(t)`` detaches ``t``, and
    FakeTensorMode wraps the meta output of ``aten.detach`` with
    ``FakeTensorConverter.from_meta_and_device``, which memoises the new fake tensor in a
    ``WeakValueDictionary`` (``MetaConverter.tensor_memo``). So ``Module.to`` of any module built
    under FakeTensorMode fails with "_apply(): Couldn't swap Linear.weight" (measured with
    PyTorch 2.13; peft's LoRA layers call it on their new adapters, ``BaseTunerLayer.
    _move_adapter_to_device_of_base_layer``).

    The replacement converts as ``Module._apply`` does, but puts a converted parameter or buffer
    in its module's ``_parameters`` / ``_buffers`` instead of swapping it in place. The bytes are
    those of a real ``Module.to``: a tensor already in that dtype and device is kept (``Tensor.to``
    returns it, no copy); another one is copied and the old storage released once nothing
    refers to it. A parameter shared by several modules (tied embeddings) is converted once and
    stays shared (a memo over one outermost call). Modules without fake tensors of their own use
    PyTorch's ``_apply``.
    """
    original = torch.nn.Module._apply
    if getattr(original, "_memsweep_fake", False):
        return False
    torch.nn.Module._apply = _replacing_apply(original)  # type: ignore[method-assign]  # dry-run processes only
    return True


class ModuleTrail:
    """The modules whose ``forward`` is running, innermost last, kept by global ``nn.Module``
    forward hooks (``torch.nn.modules.module.register_module_forward_pre_hook`` /
    ``register_module_forward_hook``): after an exception the innermost module whose forward
    had not returned is the one that was running (a forward that raised is not popped).
    Only dry-run worker processes start one; ``where`` names the module in a refusal."""

    def __init__(self) -> None:
        self.stack: list[torch.nn.Module] = []

    def start(self) -> None:
        """Register the hooks for the process's life (a dry run's)."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        register_module_forward_pre_hook(self._enter)
        register_module_forward_hook(self._exit)

    def _enter(self, module, args) -> None:
        self.stack.append(module)

    def _exit(self, module, args, output) -> None:
        for i in range(len(self.stack) - 1, -1, -1):  # also drops what a caught exception left above it
            if self.stack[i] is module:
                del self.stack[i:]
                return

    def where(self, model: torch.nn.Module | None) -> str:
        """The innermost running module, ``"module model.layers.0.self_attn (LlamaAttention)"``
        (its qualified name in ``model`` when it is part of it), or a sentence saying that no
        module's forward was running (a backward pass, the loss or the optimizer step)."""
        if not self.stack:
            return "outside any module's forward (backward pass, loss or optimizer step)"
        module = self.stack[-1]
        names = {id(m): n for n, m in model.named_modules()} if model is not None else {}
        name = names.get(id(module))
        label = ("model." + name if name else "model") if name is not None else "module"
        return f"in {label} ({type(module).__name__})"


def dry_run_unsupported(exc: BaseException, where: str | None = None) -> str | None:
    """The message of a dry run's failure when ``exc`` says that fake tensors cannot run an
    operator (data-dependent output or shape, no fake/meta kernel), or that a library would take,
    on fake tensors, a branch that the real run does not take (an exception whose class has
    ``dry_run_unsupported = True``, such as ``worker.workloads.hf_dry.TracingBranch``), else None.

    Args:
        exc: what a dry run's phase raised.
        where: the module that was running (``ModuleTrail.where``), or None.

    Returns:
        A message that names the operator (or the library function), the module, and says to
        measure the load with a real run; or None.
    """
    at = f" {where}" if where else ""
    if getattr(type(exc), "dry_run_unsupported", False):
        return f"dry run: {exc}{at}; measure this load with a real run"
    kinds = tuple(
        k
        for k in (
            getattr(fake_tensor, n, None)
            for n in (
                "DataDependentOutputException",
                "DynamicOutputShapeException",
                "UnsupportedOperatorException",
                "UnsupportedFakeTensorException",
            )
        )
        if isinstance(k, type)
    )
    if not isinstance(exc, kinds):
        return None
    op = getattr(exc, "func", None)
    return (
        f"dry run: operator {op if op is not None else '?'} cannot run on fake tensors{at} "
        f"({type(exc).__name__}: its output depends on tensor data or it has no fake/meta kernel); "
        f"measure this load with a real run"
    )
