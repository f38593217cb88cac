"""Dry-run counters: the worker's tracker on fake tensors gives the *predicted* allocated bytes.

Dry run (spec ``dry_run``, ``DryRunCounters``): every tensor the workload creates is a fake
tensor (``torch._subclasses.fake_tensor.FakeTensorMode``: shape, dtype, device, no storage),
and ``FakeLiveTensorTracker`` counts their storage bytes as ``LiveTensorTracker`` counts real
ones. Each phase's predicted peak is also split into parameters, gradients, optimizer states
and activations/temporaries (``conf.contract.PEAK_CATEGORIES``, the categories of
``torch.distributed._tools.mem_tracker``). These fields are null on real runs.

A CUDA dry run needs no GPU: fake CUDA tensors (``fake.fake_mode("cuda")``,
``fake.ensure_fake_cuda_guard``), each storage rounded up to the caching allocator's 512 B
blocks (``CUDA_BLOCK_BYTES``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import torch
from torch.nn.modules.module import register_module_parameter_registration_hook
from torch.utils._pytree import tree_leaves

from memsweep.conf.contract import CUDA_BLOCK_BYTES, PEAK_CATEGORIES

from .base import NO_EXTRA
from .cpu import LiveTensorTracker
from .fake import ModuleTrail, ensure_fake_cuda_guard, fake_mode, install_fake_module_apply

# Operators whose real kernel returns a tensor backed by a larger storage than its meta
# kernel says (measured with LiveTensorTracker on CPU, PyTorch 2.13): the real storage bytes
# as a function of (args, kwargs, itemsize). aten.mse_loss with a reduction returns a 0-dim
# result that keeps the unreduced (input-sized) buffer alive (ATen Loss.cpp mse_loss). Applied to
# CUDA dry runs too (the same ATen function; not measured on a GPU: at most one input-sized
# buffer too many).
REAL_STORAGE_BYTES = {
    "aten::mse_loss": lambda args, kwargs, out: (
        args[0].numel() * out.element_size()
        if (args[2] if len(args) > 2 else kwargs.get("reduction", 1)) != 0
        else None
    ),
}

# The CUDA caching allocator's smallest block (conf.contract.CUDA_BLOCK_BYTES, 512 B).
CUDA_ROUNDING = (
    f"cuda: each storage rounded up to {CUDA_BLOCK_BYTES} B blocks (CUDACachingAllocator kMinBlockSize, round_size)"
)
EXACT_ROUNDING = "none: exact storage bytes"


def cuda_block_bytes(nbytes: int, block: int = CUDA_BLOCK_BYTES) -> int:
    """Bytes the CUDA caching allocator counts as allocated for a request of ``nbytes`` bytes
    (int >= 0): ``nbytes`` rounded up to a multiple of ``block`` (default 512 B,
    CUDACachingAllocator.cpp ``round_size``); 0 for an empty storage (the allocator does not
    allocate for a size of 0). Blocks it hands out whole instead of splitting (a request above
    1 MiB whose cached block leaves 1 MiB or less) are larger still: not predicted.

    Raises:
        ValueError: a negative ``nbytes`` or a ``block`` below 1.
    """
    if nbytes < 0 or block < 1:
        raise ValueError(f"cuda_block_bytes: nbytes {nbytes} must be >= 0 and block {block} >= 1")
    return -(-nbytes // block) * block


class FakeLiveTensorTracker(LiveTensorTracker):
    """LiveTensorTracker for a dry run: entered inside a ``FakeTensorMode``, so every operator
    it sees returns fake tensors, whose (meta) storages have the real ``nbytes`` but no data.
    The tensor-level accounting is the same as the measured one; ``REAL_STORAGE_BYTES``
    corrects the operators whose real kernel keeps a larger storage than its meta kernel.

    It also keeps what was live at the peak, so that the peak can be split by category
    (``peak_split``): every storage gets a serial number when first seen (a StorageImpl address
    can be reused after a free, a serial cannot); the live set at the peak is the set at the
    last ``reset_peak`` with the allocations and frees since then applied up to the moment the
    peak last grew (an event log, replayed when the peak grows: each event is applied once).
    ``tag`` gives a live storage its role (parameter, gradient, optimizer_state); an untagged
    storage is an activation or temporary.

    Args:
        device_type: count only storages on that device type (``"cuda"`` for a CUDA dry run:
            host tensors, such as AdamW's ``step`` counters or a model built on the host before
            it is moved, are not in the CUDA allocator's counters); None counts every storage
            (CPU dry runs).
        block_bytes: count each storage's bytes rounded up to a multiple of this (512 for a
            CUDA dry run, ``CUDA_BLOCK_BYTES``; an empty storage stays 0); None counts exact bytes.
    """

    def __init__(self, device_type: str | None = None, block_bytes: int | None = None) -> None:
        super().__init__()
        self.device_type = device_type
        self.block_bytes = block_bytes
        self._serials: dict[int, int] = {}  # live StorageImpl address -> serial
        self._next_serial = 0
        self._peak_live: dict[int, int] = {}  # serial -> bytes, live at the peak
        self._events: list[tuple[int, int | None]] = []  # (serial, bytes or None = freed) since then
        self._roles: dict[int, str] = {}  # serial -> role, for tagged storages

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.uniform_.default and self.device_type == "cuda" and args[0].device.type == "cuda":
            # uniform_'s fake kernel is a decomposition that asks for the CUDA generator, which a
            # CPU-only PyTorch lacks; fake tensors hold no values, so any in-place random fill
            # does: normal_ (also in place, no storage allocated, as uniform_ on the GPU).
            func, args, kwargs = torch.ops.aten.normal_.default, (args[0],), {}
        if self.device_type == "cuda" and getattr(func, "overloadpacket", None) is torch.ops.aten.to:
            # Under inference_mode, Tensor.to reaches the fake mode whole (aten.to.*, not decomposed
            # to aten._to_copy). FakeTensorMode's avoid_device_init knows only _to_copy and
            # prims.device_put as device moves, so it propagates a constant (torch.tensor(...,
            # device="cuda"), as transformers' DynamicLayer.lazy_initialization makes) by running
            # the real copy to CUDA: a CUDA context on a GPU machine, "Could not run
            # 'aten::empty_strided' with arguments from the 'CUDA' backend" on a CPU-only PyTorch.
            # Its own decomposition (the CompositeImplicitAutograd kernel: _to_copy, or the tensor
            # itself when nothing changes) gives the same tensor and bytes without a constant.
            out = func.decompose(*args, **(kwargs or {}))
        else:
            out = func(*args, **(kwargs or {}))
        schema = getattr(func, "_schema", None)
        fix = REAL_STORAGE_BYTES.get(schema.name) if schema else None
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t, fix(args, kwargs or {}, t) if fix is not None else None)
        if getattr(func, "__name__", "").startswith("resize_"):
            for t in tree_leaves(args):
                if isinstance(t, torch.Tensor):
                    self._track(t)
        return out

    def _track(self, t: torch.Tensor, nbytes: int | None = None) -> None:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if self.device_type is not None and t.device.type != self.device_type:
            return  # (a fake tensor's storage is on "meta"; the tensor says its fake device)
        key = storage._cdata
        size = storage.nbytes() if nbytes is None else max(nbytes, storage.nbytes())
        if self.block_bytes is not None:
            size = cuda_block_bytes(size, self.block_bytes)
        old = self._sizes.get(key)
        if old is None:
            self._sizes[key] = size
            self._serials[key] = serial = self._next_serial
            self._next_serial += 1
            self._events.append((serial, size))
            self.live += size
            weakref.finalize(storage, self._free, key)
        elif old != size and nbytes is None and size > old:
            self._sizes[key] = size
            self._events.append((self._serials[key], size))
            self.live += size - old
        if self.live > self.peak:
            self.peak = self.live
            self._replay()

    def _free(self, key: int) -> None:
        serial = self._serials.pop(key, None)
        if serial is not None:
            self._events.append((serial, None))
        super()._free(key)

    def _replay(self) -> None:
        """Bring ``_peak_live`` to the live set of now (called when now is the peak)."""
        live = self._peak_live
        for serial, size in self._events:
            if size is None:
                live.pop(serial, None)
            else:
                live[serial] = size
        self._events.clear()

    def reset_peak(self) -> None:
        """Start a new peak window (``peak`` = ``live``, bytes); the live set at the peak is now's."""
        super().reset_peak()
        self._replay()
        # roles of storages freed before this peak window can no longer be asked for
        self._roles = {s: r for s, r in self._roles.items() if s in self._peak_live}

    def tag(self, role: str, tensors) -> None:
        """Give the live storages of ``tensors`` the role ``role`` (one of PEAK_CATEGORIES'
        names), unless they already have one (parameters are tagged first). Tensors whose
        storage was never tracked are skipped: they are not counted in ``live`` either."""
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            try:
                key = t.untyped_storage()._cdata
            except (RuntimeError, NotImplementedError):
                continue
            serial = self._serials.get(key)
            if serial is not None:
                self._roles.setdefault(serial, role)

    def peak_split(self) -> dict:
        """The phase peak (``peak``, bytes) split by the roles of the storages live at that
        moment: {record field: bytes} for PEAK_CATEGORIES; the four sum to ``peak``.

        A storage counts in the role it was tagged with at any time (phase start or end, or
        when a module registered it as a parameter); an untagged one is an activation or a
        temporary (inputs, buffers, KV cache, autograd's saved tensors, operator scratch).
        """
        sums = dict.fromkeys((name for name, _ in PEAK_CATEGORIES), 0)
        for serial, size in self._peak_live.items():
            sums[self._roles.get(serial, "activation")] += size
        return {field: sums[name] for name, field in PEAK_CATEGORIES}


class DryRunCounters:
    """Counters of a dry run: predicted live tensor bytes of fake tensors; nothing reserved
    (the ``Counters`` protocol).

    ``start`` enters ``torch._subclasses.fake_tensor.FakeTensorMode`` and, inside it, the
    tracker, so that every tensor created by the workload is fake (shape, dtype, no storage).

    On ``cuda`` the workload's tensors are fake CUDA tensors (an operator whose fake kernel
    depends on the device takes its CUDA branch), CUDA is never initialised, and the tracker
    counts only CUDA storages, each rounded up to the caching allocator's 512 B blocks
    (``CUDA_BLOCK_BYTES``): the predicted peak is the one torch.cuda.max_memory_allocated would
    report, not max_memory_reserved (segments, caching and fragmentation are not predicted).
    ``rounding`` names the accounting (``CUDA_ROUNDING`` or ``EXACT_ROUNDING``). On the CPU the
    accounting is exact storage bytes, as before.

    ``extra()`` adds the split of the phase's predicted peak (``max_memory_allocated``) into
    the categories of PEAK_CATEGORIES, bytes that sum to the peak: parameters, gradients,
    optimizer states, and activations and temporaries (everything else). The roles come from
    ``roles`` (set by the worker to ``Workload.storage_roles``), asked at the start and at the
    end of every phase, and from a module parameter registration hook (a parameter replaced
    inside a phase, as a float32 weight cast to bfloat16 in model_load, is still a parameter).

    Args:
        device: the run's device (torch.device; None = cpu).
    """

    kind = "dry_run"
    sources: dict[str, str | None] = {
        "memory_allocated": "predicted: live fake-tensor storage bytes (dry run, FakeTensorMode)",
        "max_memory_allocated": "predicted: peak of live fake-tensor storage bytes (dry run)",
        "memory_reserved": None,
        "max_memory_reserved": None,
        **{
            field: f"predicted: bytes of {name.replace('_', ' ')}s live at the phase's predicted peak "
            f"(categories of torch.distributed._tools.mem_tracker; activation = everything else)"
            for name, field in PEAK_CATEGORIES
        },
    }

    def __init__(self, device: torch.device | None = None) -> None:
        kind = device.type if device is not None else "cpu"
        self.fake_mode = fake_mode(kind)
        if kind == "cuda":
            self.tracker = FakeLiveTensorTracker(device_type="cuda", block_bytes=CUDA_BLOCK_BYTES)
            self.rounding = CUDA_ROUNDING
            self.sources = {
                k: (v if v is None else v + "; CUDA storages only, each rounded up to 512 B blocks")
                for k, v in type(self).sources.items()
            }
        else:
            self.tracker = FakeLiveTensorTracker()
            self.rounding = EXACT_ROUNDING
        self.roles: Callable[[], Iterable[tuple[str, list[torch.Tensor]]]] | None = None  # see Workload.storage_roles
        self.cuda_guard: str | None = None  # CUDA dry run: how PyTorch has a CUDA device guard (ensure_fake_cuda_guard)
        self.trail = ModuleTrail()  # the running module, named when fake tensors cannot follow

    def start(self) -> None:
        """Install the fake CUDA device guard (CUDA dry run; a failure is kept in ``cuda_guard``),
        the parameter registration hook and ``Module.to`` for fake modules
        (``install_fake_module_apply``), then enter the fake mode and the tracker for the rest of
        the process."""
        if self.rounding == CUDA_ROUNDING:
            try:
                self.cuda_guard = ensure_fake_cuda_guard()
            except RuntimeError as exc:  # indexing a fake CUDA tensor will fail (an error, recorded)
                self.cuda_guard = f"none: {exc}"

        def on_parameter(module, name, param) -> None:  # returns None: the parameter is kept
            if param is not None:
                self.tracker.tag("parameter", [param])

        register_module_parameter_registration_hook(on_parameter)  # for the process's life (a dry run's)
        install_fake_module_apply()
        self.trail.start()
        self.fake_mode.__enter__()
        self.tracker.__enter__()
        torch.empty(0)  # the first operator through the modes (FakeTensorMode's needs torch._dynamo, imported before)

    def where(self, model: torch.nn.Module | None) -> str:
        """The module that was running (``ModuleTrail.where``), for a DryRunUnsupported message."""
        return self.trail.where(model)

    def _tag(self) -> None:
        for role, tensors in self.roles() if self.roles is not None else ():
            self.tracker.tag(role, tensors)

    def synchronize(self) -> None:
        """Nothing to wait for (fake tensors run no kernel)."""
        pass

    def memory_allocated(self) -> int | None:
        """Predicted live storage bytes (the tracker's ``live``)."""
        return self.tracker.live

    def max_memory_allocated(self) -> int | None:
        """Predicted peak of live storage bytes since the last reset (the tracker's ``peak``)."""
        return self.tracker.peak

    def memory_reserved(self) -> int | None:
        """None: a dry run does not predict what an allocator reserves."""
        return None

    def max_memory_reserved(self) -> int | None:
        """None: a dry run does not predict what an allocator reserves."""
        return None

    def extra(self) -> dict:
        """``NO_EXTRA`` plus the split of the phase's predicted peak (``peak_split``, bytes),
        after tagging the storages of ``roles``."""
        self._tag()
        return {**NO_EXTRA, **self.tracker.peak_split()}

    def oom_detail(self) -> dict | None:
        """None: fake tensors use no memory, so a dry run has no capacity to refuse a request."""
        return None

    def reset_peak_memory_stats(self) -> None:
        """Tag the storages of ``roles``, then start a new peak window."""
        self._tag()
        self.tracker.reset_peak()
