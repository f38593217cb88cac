"""The four memory counters, per device kind, read by the phase protocol.

Every counter returns an integer number of bytes, or ``None`` when it cannot be read.

CUDA (and ROCm builds, which reuse ``torch.cuda``): the caching allocator's counters,
through the device-generic ``torch.accelerator`` functions where this PyTorch has them,
``torch.cuda`` otherwise (PyTorch docs: torch.cuda.memory_allocated, memory_reserved,
max_memory_allocated, max_memory_reserved, reset_peak_memory_stats, synchronize).

CPU: there is no allocator with counters, so

* "allocated" = bytes of live tensor storages, tracked by a ``TorchDispatchMode`` that
  sees every tensor an operator returns and a weakref finalizer on its storage that
  subtracts it when freed (the method of ``torch.distributed._tools.mem_tracker``);
* "reserved" = the process resident set, ``VmRSS`` of /proc/self/status, its peak
  ``VmHWM``, reset by writing ``5`` to /proc/self/clear_refs (Linux proc(5)).

Extra counters, read at the end of every phase (``extra()``), null where the backend has
none: ``num_alloc_retries``, ``num_ooms`` and ``inactive_split_bytes`` (current) from
``torch.cuda.memory_stats`` (cumulative since the process started, except the last), and
``device_free_memory`` / ``device_total_memory`` from ``torch.cuda.mem_get_info``, which also
see memory used outside PyTorch's allocator (CUDA context, other processes). On the CPU the
last two are MemAvailable / MemTotal of /proc/meminfo.

Several devices per run (spec ``devices`` > 1, CUDA only): ``MultiDeviceCounters`` wraps one
``CudaCounters`` per device; its main counters are cuda:0's and ``per_device()`` gives each
device's counters, recorded per phase in the ``devices`` list.

A CPU figure is labelled as such in the record (``counter_sources``) and is never a GPU
measurement.

Dry run (spec ``dry_run``, ``DryRunCounters``): the same tracker on fake tensors gives the
*predicted* allocated bytes; each phase's predicted peak is also split into parameters,
gradients, optimizer states and activations/temporaries (``records.PEAK_CATEGORIES``, the
categories of ``torch.distributed._tools.mem_tracker``). These fields are null on real runs.
"""

from __future__ import annotations

import os
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from conf.contract import PEAK_CATEGORIES, PEAK_SPLIT_FIELDS, meminfo_bytes, proc_kb_field


def _proc_status_bytes(key: str) -> int | None:
    return proc_kb_field("/proc/self/status", key)


class LiveTensorTracker(TorchDispatchMode):
    """Counts the bytes of live tensor storages created while the mode is active, and, when
    given a ``capacity``, refuses the operators that would take them past it.

    Storages are deduplicated by their StorageImpl pointer, so views and in-place
    results are counted once; a storage whose size changes (``resize_``) is re-counted.
    ``live`` and ``peak`` are bytes (ints).

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
        # a run that needs no Dynamo does not import it (worker.records.needs_dynamo).
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = list(tree_leaves(out))
        if getattr(func, "__name__", "").startswith("resize_"):
            tensors += tree_leaves(args)
        changes: dict[int, tuple] = {}  # StorageImpl address -> (storage, new bytes, old bytes or None)
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":  # meta tensors own no memory
                try:
                    storage = t.untyped_storage()
                except (RuntimeError, NotImplementedError):  # tensors without storage (sparse, etc.)
                    continue
                key, nbytes = storage._cdata, storage.nbytes()
                old = self._sizes.get(key)
                if old != nbytes:
                    changes[key] = (storage, nbytes, old)
        if self.capacity is not None:
            growth = sum(nbytes - (old or 0) for _, nbytes, old in changes.values())
            if growth > 0 and self.live + growth > self.capacity:
                raise self._refuse(growth, func)
        for key, (storage, nbytes, old) in changes.items():
            self._sizes[key] = nbytes
            self.live += nbytes - (old or 0)
            if old is None:
                weakref.finalize(storage, self._free, key)
        if self.live > self.peak:
            self.peak = self.live
        return out

    def _refuse(self, request: int, func) -> Exception:
        """The OutOfMemoryError of a request of ``request`` bytes that does not fit."""
        self.refused = {"oom_request_bytes": request, "oom_allocated_bytes": self.live,
                        "oom_operator": str(func)}
        free = self.capacity - self.live
        return torch.OutOfMemoryError(
            f"CPU out of memory (memsweep capacity_mode=allocator). Tried to allocate {_mib(request)} "
            f"({request} bytes) in {func}. CPU capacity of {_mib(self.capacity)} ({self.capacity} bytes) "
            f"of which {_mib(free)} ({free} bytes) is free. Of the allocated memory {_mib(self.live)} "
            f"({self.live} bytes) is allocated by live tensors (memsweep tracker).")

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def reset_peak(self) -> None:
        self.peak = self.live


def _mib(nbytes: int) -> str:
    """``nbytes`` in MiB (2^20 B) with two decimals, as the CUDA caching allocator prints sizes."""
    return f"{nbytes / 2**20:.2f} MiB"


# The extra counters of a phase record (``extra()``), null where a backend has none (never 0).
NO_EXTRA = dict.fromkeys(("num_alloc_retries", "num_ooms", "inactive_split_bytes", "device_free_memory",
                          "device_total_memory"))


class CpuCounters:
    """Counters for ``device="cpu"`` (see module docstring for what each one means)."""

    kind = "cpu"
    sources = {
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
        self.tracker.__enter__()
        torch.empty(0)  # the first operator through the mode, outside every phase

    def synchronize(self) -> None:
        pass  # CPU operators complete before they return

    def memory_allocated(self) -> int | None:
        return self.tracker.live

    def max_memory_allocated(self) -> int | None:
        return self.tracker.peak

    def memory_reserved(self) -> int | None:
        return _proc_status_bytes("VmRSS")

    def max_memory_reserved(self) -> int | None:
        # A peak we could not reset would include earlier phases: report it as missing.
        return _proc_status_bytes("VmHWM") if self._hwm_resettable else None

    def extra(self) -> dict:
        return {**NO_EXTRA, "device_free_memory": meminfo_bytes("MemAvailable"),
                "device_total_memory": meminfo_bytes("MemTotal"), **NO_PEAK_SPLIT}

    def oom_detail(self) -> dict | None:
        """The request the capacity refused (``LiveTensorTracker.refused``: bytes asked, bytes
        live, operator), or None when the tracker refused nothing (no capacity, or an OOM that
        came from elsewhere)."""
        return self.tracker.refused

    def reset_peak_memory_stats(self) -> None:
        self.tracker.reset_peak()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self._hwm_resettable = False


class CudaCounters:
    """Counters of the CUDA caching allocator for one device (also ROCm/HIP builds)."""

    kind = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.index = device.index if device.index is not None else 0
        acc = getattr(torch, "accelerator", None)
        self._api = acc if acc is not None and hasattr(acc, "max_memory_reserved") else torch.cuda
        api_name = "torch.accelerator" if self._api is not torch.cuda else "torch.cuda"
        backend = "hip" if torch.version.hip else "cuda"
        self.sources = {name: f"{backend}: {api_name}.{name}" for name in (
            "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved")}
        self.sources.update({
            "num_alloc_retries": f"{backend}: torch.cuda.memory_stats num_alloc_retries",
            "num_ooms": f"{backend}: torch.cuda.memory_stats num_ooms",
            "inactive_split_bytes": f"{backend}: torch.cuda.memory_stats inactive_split_bytes.all.current",
            "device_free_memory": f"{backend}: torch.cuda.mem_get_info (free)",
            "device_total_memory": f"{backend}: torch.cuda.mem_get_info (total)"})

    def start(self) -> None:
        torch.cuda.set_device(self.index)
        torch.cuda.init()

    def synchronize(self) -> None:
        self._api.synchronize(self.index)

    def memory_allocated(self) -> int | None:
        return int(self._api.memory_allocated(self.index))

    def max_memory_allocated(self) -> int | None:
        return int(self._api.max_memory_allocated(self.index))

    def memory_reserved(self) -> int | None:
        return int(self._api.memory_reserved(self.index))

    def max_memory_reserved(self) -> int | None:
        return int(self._api.max_memory_reserved(self.index))

    def reset_peak_memory_stats(self) -> None:
        self._api.reset_peak_memory_stats(self.index)

    def extra(self) -> dict:
        out = {**NO_EXTRA, **NO_PEAK_SPLIT}
        try:
            stats = torch.cuda.memory_stats(self.index)
            out.update(num_alloc_retries=stats.get("num_alloc_retries"), num_ooms=stats.get("num_ooms"),
                       inactive_split_bytes=stats.get("inactive_split_bytes.all.current"))
        except Exception:  # noqa: BLE001 - e.g. cudaMallocAsync backend without these stats
            pass
        try:
            free, total = torch.cuda.mem_get_info(self.index)
            out.update(device_free_memory=int(free), device_total_memory=int(total))
        except Exception:  # noqa: BLE001
            pass
        return out


class MultiDeviceCounters:
    """Counters of a run that uses several devices: one per-device counter object each
    (``CudaCounters`` for cuda:0 .. cuda:N-1), the first being the run's device.

    * ``synchronize`` and ``reset_peak_memory_stats`` act on every device (PyTorch docs:
      torch.cuda.synchronize(device), torch.cuda.reset_peak_memory_stats(device) act on one
      device each), so every device's peak covers the same phase window;
    * the four main counters (``memory_allocated``, ``memory_reserved``,
      ``max_memory_allocated``, ``max_memory_reserved``, bytes) and ``extra()`` are those of the
      first device, cuda:0, the run's device: the phase record's main columns mean the same as in
      a one-device run;
    * ``per_device()`` gives the per-device counter objects, which ``run_phase`` reads into the
      phase record's ``devices`` list (one entry per device, bytes, null when unreadable).

    ``devices``: objects with ``index`` (int) and the methods of ``CudaCounters``.

    Raises:
        ValueError: ``devices`` is empty.
    """

    kind = "cuda"

    def __init__(self, devices: list) -> None:
        if not devices:
            raise ValueError("MultiDeviceCounters needs at least one device")
        self.devices = list(devices)
        self.main = self.devices[0]
        self.index = self.main.index
        self.device = getattr(self.main, "device", None)
        self.sources = dict(self.main.sources)
        self.sources["devices"] = (f"per device, cuda:{self.devices[0].index}..cuda:{self.devices[-1].index}: "
                                   f"the same counters; main counters are cuda:{self.main.index}'s")

    def start(self) -> None:
        for counters in self.devices[1:]:  # initialise every device, then make the run's device current
            counters.start()
        self.main.start()

    def per_device(self) -> list:
        """The per-device counter objects, in device order (the run's device first)."""
        return list(self.devices)

    def synchronize(self) -> None:
        for counters in self.devices:
            counters.synchronize()

    def reset_peak_memory_stats(self) -> None:
        for counters in self.devices:
            counters.reset_peak_memory_stats()

    def memory_allocated(self) -> int | None:
        return self.main.memory_allocated()

    def max_memory_allocated(self) -> int | None:
        return self.main.max_memory_allocated()

    def memory_reserved(self) -> int | None:
        return self.main.memory_reserved()

    def max_memory_reserved(self) -> int | None:
        return self.main.max_memory_reserved()

    def extra(self) -> dict:
        return self.main.extra()


def apply_cpu_allocator_capacity(counters: CpuCounters, capacity_bytes: int) -> dict:
    """Cap the CPU run's live tensor storage bytes at ``capacity_bytes`` (``capacity_mode=allocator``).

    The meaning a GPU capacity has (torch.cuda.set_per_process_memory_fraction caps what the
    caching allocator hands out, PyTorch doc), given to the CPU: the worker's
    ``LiveTensorTracker`` refuses an operator whose new storages would take the live bytes
    past the capacity with ``torch.OutOfMemoryError`` (see ``LiveTensorTracker``). Memory the
    process holds outside tensors (malloc's arenas, thread stacks, oneDNN/BLAS buffers, the
    code) is not charged, so the answer is the same on every machine.

    Returns the record's ``capacity`` description (``capacity_mode``, ``capacity_method``).
    """
    counters.tracker.capacity = capacity_bytes
    return {"capacity_mode": "allocator",
            "capacity_method": "live tensor storage bytes <= capacity (worker tracker raises torch.OutOfMemoryError)"}


def apply_cpu_process_capacity(capacity_bytes: int) -> dict:
    """Bound the worker's further memory growth to ``capacity_bytes`` with RLIMIT_DATA
    (``capacity_mode=process``: does this process fit in N bytes of RAM).

    The limit is set to the current data segment size (``VmData``, measured after torch
    is imported and its thread pool started) plus the capacity, so that allocations past
    the capacity fail inside the allocator ("DefaultCPUAllocator: can't allocate memory"),
    a real allocation failure rather than a kill by the kernel. Linux setrlimit(2):
    since 4.7 RLIMIT_DATA counts private writable mappings, which is where glibc's
    malloc and mmap put tensor storage.
    """
    import resource

    baseline = _proc_status_bytes("VmData")
    if baseline is None:
        raise RuntimeError("cannot read VmData from /proc/self/status to emulate a CPU capacity")
    limit = baseline + capacity_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY and limit > hard:
        limit = hard
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return {"capacity_mode": "process", "capacity_method": "RLIMIT_DATA = VmData at start + capacity",
            "capacity_baseline_bytes": baseline, "rlimit_data_bytes": limit}


def apply_cuda_capacity(counters: CudaCounters, capacity_bytes: int, total_memory: int) -> dict:
    """Cap the caching allocator at ``capacity_bytes`` via set_per_process_memory_fraction.

    PyTorch doc (torch.cuda.set_per_process_memory_fraction): an allocation that would
    take the allocator past fraction * total_memory raises torch.OutOfMemoryError.
    """
    if capacity_bytes > total_memory:
        raise ValueError(f"capacity {capacity_bytes} B exceeds the device's total_memory {total_memory} B")
    fraction = capacity_bytes / total_memory
    torch.cuda.set_per_process_memory_fraction(fraction, counters.index)
    return {"capacity_mode": "allocator", "capacity_method": "torch.cuda.set_per_process_memory_fraction",
            "memory_fraction": fraction}


def apply_cuda_capacity_per_device(counters: MultiDeviceCounters, capacity_bytes: int) -> dict:
    """``apply_cuda_capacity`` on every device of a multi-device run: each device's caching
    allocator is capped at ``capacity_bytes`` (bytes) of its own ``total_memory`` (from
    torch.cuda.mem_get_info(device), PyTorch doc), via
    torch.cuda.set_per_process_memory_fraction(fraction, device).

    Returns the capacity description of cuda:0 (``memory_fraction``) plus ``memory_fractions``,
    one per device in order.

    Raises:
        ValueError: ``capacity_bytes`` exceeds a device's total_memory.
    """
    fractions = []
    for device_counters in counters.per_device():
        _, total = torch.cuda.mem_get_info(device_counters.index)
        fractions.append(apply_cuda_capacity(device_counters, capacity_bytes, int(total))["memory_fraction"])
    return {"capacity_mode": "allocator", "capacity_method": "torch.cuda.set_per_process_memory_fraction (every device)",
            "memory_fraction": fractions[0], "memory_fractions": fractions}


def make_counters(device: torch.device, devices: int = 1):
    """The counters of a run on ``device``; with ``devices`` > 1 (CUDA only), a
    ``MultiDeviceCounters`` over cuda:index .. cuda:index+devices-1, ``device`` first.

    Raises:
        ValueError: an unsupported device type, or devices > 1 on a non-CUDA device.
    """
    if devices > 1:
        if device.type != "cuda":
            raise ValueError(f"devices={devices} needs a CUDA device, not {device.type!r}")
        first = device.index if device.index is not None else 0
        return MultiDeviceCounters([CudaCounters(torch.device("cuda", first + i)) for i in range(devices)])
    if device.type == "cuda":
        return CudaCounters(device)
    if device.type == "cpu":
        return CpuCounters()
    raise ValueError(f"unsupported device type {device.type!r}")


def env_alloc_conf() -> dict:
    return {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
                                           "PYTORCH_ALLOC_CONF")}


# Operators whose real kernel returns a tensor backed by a larger storage than its meta
# kernel says (measured with LiveTensorTracker on CPU, PyTorch 2.13): the real storage bytes
# as a function of (args, kwargs, itemsize). aten.mse_loss with a reduction returns a 0-dim
# result that keeps the unreduced (input-sized) buffer alive (ATen Loss.cpp mse_loss). Applied to
# CUDA dry runs too (the same ATen function; not measured on a GPU: at most one input-sized
# buffer too many).
_REAL_STORAGE_BYTES = {
    "aten::mse_loss": lambda args, kwargs, out: (
        args[0].numel() * out.element_size()
        if (args[2] if len(args) > 2 else kwargs.get("reduction", 1)) != 0 else None),
}


NO_PEAK_SPLIT = dict.fromkeys(PEAK_SPLIT_FIELDS)  # a measured run has no split: null, never 0

# The CUDA caching allocator's smallest block: every request is rounded up to a multiple of
# 512 bytes, and torch.cuda.memory_allocated / max_memory_allocated count those rounded blocks
# (PyTorch c10/cuda/CUDACachingAllocator.cpp: ``kMinBlockSize = 512``, ``round_size``; with
# the default allocator settings, i.e. no ``roundup_power2_divisions`` in PYTORCH_CUDA_ALLOC_CONF).
CUDA_BLOCK_BYTES = 512
CUDA_ROUNDING = "cuda: each storage rounded up to 512 B blocks (CUDACachingAllocator kMinBlockSize, round_size)"
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
    The tensor-level accounting is the same as the measured one; ``_REAL_STORAGE_BYTES``
    corrects the operators whose real kernel keeps a larger storage than its meta kernel.

    It also keeps what was live at the peak, so that the peak can be split by category
    (``peak_split``): every storage gets a serial number when first seen (a StorageImpl address
    can be reused after a free, a serial cannot); the live set at the peak is the set at the
    last ``reset_peak`` with the allocations and frees since then applied up to the moment the
    peak last grew (an event log, replayed when the peak grows: each event is applied once).
    ``tag`` gives a live storage its role (parameter, gradient, optimizer_state); an untagged
    storage is an activation or temporary.

    ``device_type``: count only storages on that device type (``"cuda"`` for a CUDA dry run:
    host tensors, such as AdamW's ``step`` counters or a model built on the host before it is
    moved, are not in the CUDA allocator's counters); None counts every storage (CPU dry runs).
    ``block_bytes``: count each storage's bytes rounded up to a multiple of this (512 for a
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
        out = func(*args, **(kwargs or {}))
        fix = _REAL_STORAGE_BYTES.get(getattr(func, "_schema", None) and func._schema.name)
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


def _fake_mode(device_type: str):
    """The FakeTensorMode of a dry run on ``device_type``.

    For ``cuda``, a subclass whose ``avoid_device_init`` is always True (FakeTensorMode sets it
    only when no GPU is visible): ``torch.tensor`` constants are never lifted onto the device
    and no constant is propagated across a device move, so a CUDA dry run never touches a real
    GPU, on a machine that has one too (torch/_subclasses/fake_tensor.py, NOTE "torch.tensor,
    lift_fresh, and device movement").
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    if device_type != "cuda":
        return FakeTensorMode()

    class NoDeviceInitFakeTensorMode(FakeTensorMode):
        @property
        def avoid_device_init(self) -> bool:
            return True

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
    import ctypes
    import glob

    libs = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.*")))
    if not libs:
        raise RuntimeError("libc10 not found next to torch")
    try:
        registry = (ctypes.c_void_p * _DEVICE_TYPES).in_dll(ctypes.CDLL(libs[0]),
                                                          "_ZN3c104impl26device_guard_impl_registryE")
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


class DryRunCounters:
    """Counters of a dry run: predicted live tensor bytes of fake tensors; nothing reserved.

    ``start`` enters ``torch._subclasses.fake_tensor.FakeTensorMode`` and, inside it, the
    tracker, so that every tensor created by the workload is fake (shape, dtype, no storage).

    ``device``: the run's device (torch.device; None = cpu). On ``cuda`` the workload's tensors
    are fake CUDA tensors (an operator whose fake kernel depends on the device takes its CUDA
    branch), CUDA is never initialised, and the tracker counts only
    CUDA storages, each rounded up to the caching allocator's 512 B blocks
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
    """

    kind = "dry_run"
    sources = {
        "memory_allocated": "predicted: live fake-tensor storage bytes (dry run, FakeTensorMode)",
        "max_memory_allocated": "predicted: peak of live fake-tensor storage bytes (dry run)",
        "memory_reserved": None, "max_memory_reserved": None,
        **{field: f"predicted: bytes of {name.replace('_', ' ')}s live at the phase's predicted peak "
                  f"(categories of torch.distributed._tools.mem_tracker; activation = everything else)"
           for name, field in PEAK_CATEGORIES},
    }

    def __init__(self, device: torch.device | None = None) -> None:
        kind = device.type if device is not None else "cpu"
        self.fake_mode = _fake_mode(kind)
        if kind == "cuda":
            self.tracker = FakeLiveTensorTracker(device_type="cuda", block_bytes=CUDA_BLOCK_BYTES)
            self.rounding = CUDA_ROUNDING
            self.sources = {k: (v if v is None else v + "; CUDA storages only, each rounded up to 512 B blocks")
                            for k, v in type(self).sources.items()}
        else:
            self.tracker = FakeLiveTensorTracker()
            self.rounding = EXACT_ROUNDING
        self.roles = None  # () -> iterable of (role, tensors); see Workload.storage_roles
        self.cuda_guard = None  # CUDA dry run: how PyTorch has a CUDA device guard (ensure_fake_cuda_guard)

    def start(self) -> None:
        from torch.nn.modules.module import register_module_parameter_registration_hook

        if self.rounding == CUDA_ROUNDING:
            try:
                self.cuda_guard = ensure_fake_cuda_guard()
            except RuntimeError as exc:  # indexing a fake CUDA tensor will fail (an error, recorded)
                self.cuda_guard = f"none: {exc}"

        def on_parameter(module, name, param) -> None:  # returns None: the parameter is kept
            if param is not None:
                self.tracker.tag("parameter", [param])

        register_module_parameter_registration_hook(on_parameter)  # for the process's life (a dry run's)
        self.fake_mode.__enter__()
        self.tracker.__enter__()
        torch.empty(0)  # the first operator through the modes (FakeTensorMode's needs torch._dynamo, imported before)

    def _tag(self) -> None:
        for role, tensors in (self.roles() if self.roles is not None else ()):
            self.tracker.tag(role, tensors)

    def synchronize(self) -> None:
        pass

    def memory_allocated(self) -> int | None:
        return self.tracker.live

    def max_memory_allocated(self) -> int | None:
        return self.tracker.peak

    def memory_reserved(self) -> int | None:
        return None

    def max_memory_reserved(self) -> int | None:
        return None

    def extra(self) -> dict:
        self._tag()
        return {**NO_EXTRA, **self.tracker.peak_split()}

    def reset_peak_memory_stats(self) -> None:
        self._tag()
        self.tracker.reset_peak()


def dry_run_unsupported(exc: BaseException) -> str | None:
    """The message of a dry run's failure when ``exc`` says that fake tensors cannot run an
    operator (data-dependent output or shape, no fake/meta kernel), else None."""
    from torch._subclasses import fake_tensor as ft

    kinds = tuple(k for k in (getattr(ft, n, None) for n in (
        "DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException",
        "UnsupportedFakeTensorException")) if isinstance(k, type))
    if not isinstance(exc, kinds):
        return None
    op = getattr(exc, "func", None)
    return (f"dry run: operator {op if op is not None else '?'} cannot run on fake tensors "
            f"({type(exc).__name__}: its output depends on tensor data or it has no fake/meta kernel); "
            f"measure this load with a real run")
