"""CPU counters: live tensor storage bytes (a dispatch-mode tracker) and the process resident set.

* "allocated" = bytes of live tensor storages, tracked by a ``TorchDispatchMode`` that sees
  every tensor an operator returns, and a weakref finalizer on its storage that subtracts it
  when freed (the method of ``torch.distributed._tools.mem_tracker``);
* "reserved" = the process resident set, ``VmRSS`` of /proc/self/status, its peak ``VmHWM``,
  reset by writing ``5`` to /proc/self/clear_refs (Linux proc(5)).

``extra()``'s ``device_free_memory`` / ``device_total_memory`` are MemAvailable / MemTotal of
/proc/meminfo. The CPU capacities: ``apply_cpu_allocator_capacity`` (``capacity_mode=allocator``:
the tracker refuses what would pass the capacity) and ``apply_cpu_process_capacity``
(``capacity_mode=process``, RLIMIT_DATA). A CPU figure is never a GPU measurement.
"""

from __future__ import annotations

import resource
import threading
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    is_traceable_wrapper_subclass,
    is_traceable_wrapper_subclass_type,
)
from torch.utils._pytree import tree_leaves

from memsweep.conf.contract import proc_kb_field, proc_kb_fields

from .base import NO_EXTRA, NO_PEAK_SPLIT


def _proc_status_bytes(key: str) -> int | None:
    return proc_kb_field("/proc/self/status", key)


class LiveTensorTracker(TorchDispatchMode):
    """Counts the bytes of live tensor storages created while the mode is active, and, when
    given a ``capacity``, refuses the operators that would take them past it.

    Storages are deduplicated by their StorageImpl pointer, so views and in-place
    results are counted once; a storage whose size changes (``resize_``) is re-counted,
    including ``UntypedStorage.resize_``, a storage method no dispatch mode sees (FSDP2 frees and
    re-gathers its unsharded parameters with it): the tracker patches it while it is active.
    Only storages that hold memory count (``memory_storages``): a wrapper tensor subclass
    (DTensor) is counted by its inner tensors, never by its placeholder storage, and its
    operators are left to the subclass first, which desugars them into operators on its inner
    tensors that the tracker sees. ``live`` and ``peak`` are bytes (ints).

    ``capacity`` (bytes, or None for no limit): the CPU capacity of ``capacity_mode=allocator``,
    the meaning ``torch.cuda.set_per_process_memory_fraction`` gives a GPU capacity (a cap on
    what the allocator hands out, not on the process). An operator whose new storages would
    take ``live`` past ``capacity`` raises ``torch.OutOfMemoryError`` (message shaped as the
    CUDA caching allocator's: what was tried, the capacity, what is already allocated); its
    storages are never counted, so ``peak`` never exceeds the capacity, and ``refused`` holds
    the refused request (``oom_request_bytes``, ``oom_allocated_bytes``, ``oom_operator``).
    The operator's kernel has run when the check is made (a dispatch mode sees its outputs),
    so the host briefly holds one refused operator's outputs above the capacity; they are
    freed as the error unwinds. The answer depends only on the tensors the load creates,
    never on malloc, threads or other memory of the process, so it is the same on every
    machine.

    Args:
        capacity: the most live storage bytes the tracker lets operators create, or None.

    Raises:
        torch.OutOfMemoryError: (from an operator run under the mode) its new storages would
            take ``live`` past ``capacity``.
    """

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.capacity = capacity
        self.refused: dict | None = None
        self._sizes: dict[int, int] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo unless
        # this says False (torch/utils/_python_dispatch.py, "a temporary measure to roll out" skipping
        # compilation inside dispatch frames); the wrapper imports torch._dynamo on the first
        # operator. This mode is never compiled (memsweep does not torch.compile its counters), so
        # a run that needs no Dynamo does not import it (conf.contract.needs_dynamo).
        return False

    def __enter__(self) -> LiveTensorTracker:
        _watch_resizes(self)
        try:
            return super().__enter__()
        except BaseException:
            _unwatch_resizes(self)
            raise

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
        try:
            return super().__exit__(exc_type, exc_val, exc_tb)
        finally:
            _unwatch_resizes(self)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            # A wrapper subclass (DTensor: FSDP2's sharded parameters, their gradients and optimizer
            # states) holds its memory in inner tensors and its own storage has none. NotImplemented
            # lets the subclass run first and desugar into operators on its inner tensors, which
            # come back through this mode (the method of torch.distributed._tools.mem_tracker).
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        tensors = list(tree_leaves(out))
        if getattr(func, "__name__", "").startswith("resize_"):
            tensors += tree_leaves(args)
        changes: dict[int, tuple] = {}  # StorageImpl address -> (storage, new bytes, old bytes or None)
        for t in tensors:
            if isinstance(t, torch.Tensor):
                for storage in memory_storages(t):
                    key, nbytes = storage._cdata, storage.nbytes()
                    old = self._sizes.get(key)
                    if old != nbytes:
                        changes[key] = (storage, nbytes, old)
        if self.capacity is not None:
            growth = sum(nbytes - (old or 0) for _, nbytes, old in changes.values())
            if growth > 0 and self.live + growth > self.capacity:
                raise self._refuse(growth, func, self.capacity)
        for key, (storage, nbytes, old) in changes.items():
            self._count(key, storage, nbytes, old)
        if self.live > self.peak:
            self.peak = self.live
        return out

    def _count(self, key: int, storage: torch.UntypedStorage, nbytes: int, old: int | None) -> None:
        """Count ``storage`` (StorageImpl address ``key``) at ``nbytes`` instead of ``old`` (None:
        first seen, its finalizer subtracts it when it is freed)."""
        self._sizes[key] = nbytes
        self.live += nbytes - (old or 0)
        if old is None:
            weakref.finalize(storage, self._free, key)

    def check_resize(self, storage: torch.UntypedStorage, nbytes: int, what: str) -> None:
        """Refuse, before it happens, a resize of ``storage`` to ``nbytes`` that would take ``live``
        past the capacity (a resize outside the dispatcher: ``UntypedStorage.resize_``).

        Raises:
            torch.OutOfMemoryError: the growth does not fit (``refused`` set, as for an operator).
        """
        if not holds_memory(storage):
            return
        growth = nbytes - self._sizes.get(storage._cdata, 0)
        if self.capacity is not None and growth > 0 and self.live + growth > self.capacity:
            raise self._refuse(growth, what, self.capacity)

    def note_resize(self, storage: torch.UntypedStorage) -> None:
        """Count ``storage`` at its current size after a resize the dispatcher does not see
        (``UntypedStorage.resize_``: FSDP2 frees and re-allocates its unsharded parameters so,
        torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``free_storage``/``alloc_storage``).
        The tracker calls it itself while it is active (see ``_watch_resizes``)."""
        if not holds_memory(storage):
            return
        key, nbytes = storage._cdata, storage.nbytes()
        old = self._sizes.get(key)
        if old != nbytes:
            self._count(key, storage, nbytes, old)
            self.peak = max(self.peak, self.live)

    def adopt(self, tensors: list[torch.Tensor], what: str) -> None:
        """Count the storages of ``tensors`` that no operator created while the tracker was
        active, such as the weights ``from_pretrained`` reads from a safetensors checkpoint
        (memory-mapped file pages wrapped as tensors outside the dispatcher): they are the
        model's memory as much as initialised weights are (on a GPU they are copied into the
        caching allocator). Storages already counted, and those without memory of their own
        (meta, a wrapper subclass's placeholder), are skipped.

        Args:
            tensors: the tensors (parameters, buffers) whose storages to count.
            what: what made them, for the OutOfMemoryError's message.

        Raises:
            torch.OutOfMemoryError: with a capacity, the adopted bytes do not fit (``refused``
                set, as for an operator).
        """
        new: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                if holds_memory(storage) and storage._cdata not in self._sizes:
                    new[storage._cdata] = storage
        growth = sum(s.nbytes() for s in new.values())
        if self.capacity is not None and growth > 0 and self.live + growth > self.capacity:
            raise self._refuse(growth, what, self.capacity)
        for key, storage in new.items():
            self._count(key, storage, storage.nbytes(), None)
        self.peak = max(self.peak, self.live)

    def _refuse(self, request: int, func, capacity: int) -> Exception:
        """The OutOfMemoryError of a request of ``request`` bytes that does not fit in ``capacity`` bytes."""
        self.refused = {"oom_request_bytes": request, "oom_allocated_bytes": self.live, "oom_operator": str(func)}
        free = capacity - self.live
        return torch.OutOfMemoryError(
            f"CPU out of memory (memsweep capacity_mode=allocator). Tried to allocate {_mib(request)} "
            f"({request} bytes) in {func}. CPU capacity of {_mib(capacity)} ({capacity} bytes) "
            f"of which {_mib(free)} ({free} bytes) is free. Of the allocated memory {_mib(self.live)} "
            f"({self.live} bytes) is allocated by live tensors (memsweep tracker)."
        )

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def reset_peak(self) -> None:
        """Start a new peak window: ``peak`` = ``live`` (bytes)."""
        self.peak = self.live


def _mib(nbytes: int) -> str:
    """``nbytes`` in MiB (2^20 B) with two decimals, as the CUDA caching allocator prints sizes."""
    return f"{nbytes / 2**20:.2f} MiB"


def holds_memory(storage: torch.UntypedStorage) -> bool:
    """Whether ``storage`` has memory of its own: not a meta storage, and not the placeholder of a
    wrapper tensor subclass (``_make_wrapper_subclass``, e.g. DTensor), whose ``nbytes`` is the
    logical size of the whole tensor but whose data pointer cannot even be read."""
    if storage.device.type == "meta":
        return False
    try:
        storage.data_ptr()
    except RuntimeError:  # "Attempted to access the data pointer on an invalid python storage"
        return False
    return True


def memory_storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages that hold ``t``'s memory: its own storage when it has memory (``holds_memory``),
    else, for a traceable wrapper subclass (DTensor: its local shard), those of its inner tensors
    (``__tensor_flatten__``, recursively, as torch.distributed._tools.common_utils.get_untyped_storages);
    none for a meta tensor or a tensor without storage (sparse, etc.)."""
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensors without storage (sparse, etc.)
        storage = None
    if storage is not None and holds_memory(storage):
        return [storage]
    if not is_traceable_wrapper_subclass(t):
        return []
    out: list[torch.UntypedStorage] = []
    for name in t.__tensor_flatten__()[0]:
        inner = getattr(t, name, None)
        if isinstance(inner, torch.Tensor):
            out += memory_storages(inner)
    return out


# UntypedStorage.resize_ is a storage method, no operator: a dispatch mode never sees it, yet FSDP2
# frees and re-allocates its unsharded parameters with it (``free_storage``/``alloc_storage`` in
# torch/distributed/fsdp/_fully_shard/_fsdp_param.py). While a LiveTensorTracker is active, the
# method is patched to ask every active tracker first (an emulated capacity refuses a growth past
# it) and to let them count the storage at its new size after; the last tracker to leave restores
# the method it replaced (unless something patched over it since: then the patch stays and passes
# calls through). A call that comes back into the patch through another patch of the method that
# wraps this one (torch.distributed._tools.mem_tracker does so) goes to the genuine method.
_RESIZE_WATCHERS: list[LiveTensorTracker] = []
_resize_state: dict = {"replaced": None, "genuine": None}
_in_resize = threading.local()


def _watched_resize_(storage: torch.UntypedStorage, size: int):
    if getattr(_in_resize, "active", False):
        return _resize_state["genuine"](storage, size)
    watchers = list(dict.fromkeys(_RESIZE_WATCHERS))  # a tracker entered twice asks once
    for tracker in watchers:
        tracker.check_resize(storage, int(size), "UntypedStorage.resize_")
    _in_resize.active = True
    try:
        out = _resize_state["replaced"](storage, size)
    finally:
        _in_resize.active = False
    for tracker in watchers:
        tracker.note_resize(storage)
    return out


def adopt_storages(tensors: list[torch.Tensor], what: str) -> None:
    """Let every active tracker count ``tensors``' storages that no operator created
    (``LiveTensorTracker.adopt``); nothing when no tracker is active (a CUDA run).

    Raises:
        torch.OutOfMemoryError: the adopted bytes do not fit in a tracker's capacity.
    """
    for tracker in list(_RESIZE_WATCHERS):
        tracker.adopt(tensors, what)


def _watch_resizes(tracker: LiveTensorTracker) -> None:
    """Let ``tracker`` see ``UntypedStorage.resize_`` (patched while any tracker watches)."""
    current = torch.UntypedStorage.resize_
    if current is not _watched_resize_:
        _resize_state["replaced"] = current
        if _resize_state["genuine"] is None:
            _resize_state["genuine"] = current
        torch.UntypedStorage.resize_ = _watched_resize_  # type: ignore[method-assign, assignment]
    _RESIZE_WATCHERS.append(tracker)


def _unwatch_resizes(tracker: LiveTensorTracker) -> None:
    """Stop telling ``tracker`` of resizes; restore ``UntypedStorage.resize_`` after the last one."""
    if tracker in _RESIZE_WATCHERS:
        _RESIZE_WATCHERS.remove(tracker)
    if not _RESIZE_WATCHERS and torch.UntypedStorage.resize_ is _watched_resize_:
        torch.UntypedStorage.resize_ = _resize_state["replaced"]  # type: ignore[method-assign]


class CpuCounters:
    """Counters for ``device="cpu"`` (the ``Counters`` protocol; see the module docstring for
    what each one means): allocated from ``LiveTensorTracker``, reserved from /proc/self/status."""

    kind = "cpu"
    sources: dict[str, str | None] = {
        "memory_allocated": "cpu: live tensor storage bytes (worker TorchDispatchMode tracker)",
        "max_memory_allocated": "cpu: peak of live tensor storage bytes (worker tracker)",
        "memory_reserved": "cpu: process resident set (/proc/self/status VmRSS)",
        "max_memory_reserved": "cpu: peak resident set (/proc/self/status VmHWM, reset via /proc/self/clear_refs)",
        "device_free_memory": "cpu: MemAvailable of /proc/meminfo",
        "device_total_memory": "cpu: MemTotal of /proc/meminfo",
    }

    def __init__(self) -> None:
        self.tracker = LiveTensorTracker()
        self._hwm_resettable = True

    def start(self) -> None:
        """Enter the tracker for the rest of the process."""
        self.tracker.__enter__()
        torch.empty(0)  # the first operator through the mode, outside every phase

    def synchronize(self) -> None:
        """Nothing to wait for."""
        pass  # CPU operators complete before they return

    def memory_allocated(self) -> int | None:
        """Live tensor storage bytes (the tracker's ``live``)."""
        return self.tracker.live

    def max_memory_allocated(self) -> int | None:
        """Peak live tensor storage bytes since the last reset (the tracker's ``peak``)."""
        return self.tracker.peak

    def memory_reserved(self) -> int | None:
        """The resident set, VmRSS of /proc/self/status (bytes), or None."""
        return _proc_status_bytes("VmRSS")

    def max_memory_reserved(self) -> int | None:
        """The resident set's peak, VmHWM of /proc/self/status (bytes); None when it could not
        be reset (it would include earlier phases)."""
        # A peak we could not reset would include earlier phases: report it as missing.
        return _proc_status_bytes("VmHWM") if self._hwm_resettable else None

    def extra(self) -> dict:
        """``NO_EXTRA`` with the host's MemAvailable / MemTotal (/proc/meminfo, bytes)."""
        mem = proc_kb_fields("/proc/meminfo", ("MemAvailable", "MemTotal"))  # one read of the file per phase
        return {
            **NO_EXTRA,
            "device_free_memory": mem["MemAvailable"],
            "device_total_memory": mem["MemTotal"],
            **NO_PEAK_SPLIT,
        }

    def oom_detail(self) -> dict | None:
        """The request the capacity refused (``LiveTensorTracker.refused``: bytes asked, bytes
        live, operator), or None when the tracker refused nothing (no capacity, or an OOM that
        came from elsewhere)."""
        return self.tracker.refused

    def reset_peak_memory_stats(self) -> None:
        """Reset the tracker's peak and the kernel's VmHWM (write ``5`` to /proc/self/clear_refs,
        proc(5)); a failed write makes ``max_memory_reserved`` None from then on."""
        self.tracker.reset_peak()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self._hwm_resettable = False


def apply_cpu_allocator_capacity(counters: CpuCounters, capacity_bytes: int) -> dict:
    """Cap the CPU run's live tensor storage bytes at ``capacity_bytes`` (``capacity_mode=allocator``).

    The meaning a GPU capacity has (torch.cuda.set_per_process_memory_fraction caps what the
    caching allocator hands out, PyTorch doc), given to the CPU: the worker's
    ``LiveTensorTracker`` refuses an operator whose new storages would take the live bytes
    past the capacity with ``torch.OutOfMemoryError`` (see ``LiveTensorTracker``). Memory the
    process holds outside tensors (malloc's arenas, thread stacks, oneDNN/BLAS buffers, the
    code) is not charged, so the answer is the same on every machine.

    Args:
        counters: the run's CPU counters (their tracker gets the capacity).
        capacity_bytes: the capacity, bytes.

    Returns:
        The record's ``capacity`` description (``capacity_mode``, ``capacity_method``).
    """
    counters.tracker.capacity = capacity_bytes
    return {
        "capacity_mode": "allocator",
        "capacity_method": "live tensor storage bytes <= capacity (worker tracker raises torch.OutOfMemoryError)",
    }


def apply_cpu_process_capacity(capacity_bytes: int) -> dict:
    """Bound the worker's further memory growth to ``capacity_bytes`` with RLIMIT_DATA
    (``capacity_mode=process``: does this process fit in N bytes of RAM).

    The limit is set to the current data segment size (``VmData``, measured after torch
    is imported and its thread pool started) plus the capacity, so that allocations past
    the capacity fail inside the allocator ("DefaultCPUAllocator: can't allocate memory"),
    a real allocation failure rather than a kill by the kernel. Linux setrlimit(2):
    since 4.7 RLIMIT_DATA counts private writable mappings, which is where glibc's
    malloc and mmap put tensor storage.

    Args:
        capacity_bytes: the growth allowed from now on, bytes.

    Returns:
        The record's ``capacity`` description: ``capacity_mode``, ``capacity_method``,
        ``capacity_baseline_bytes`` (VmData, bytes) and ``rlimit_data_bytes`` (the limit set,
        bytes; at most the hard limit).

    Raises:
        RuntimeError: VmData cannot be read from /proc/self/status.
    """
    baseline = _proc_status_bytes("VmData")
    if baseline is None:
        raise RuntimeError("cannot read VmData from /proc/self/status to emulate a CPU capacity")
    limit = baseline + capacity_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY and limit > hard:
        limit = hard
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return {
        "capacity_mode": "process",
        "capacity_method": "RLIMIT_DATA = VmData at start + capacity",
        "capacity_baseline_bytes": baseline,
        "rlimit_data_bytes": limit,
    }
