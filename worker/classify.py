"""Failure classification: is this exception an out-of-memory, and what does its message say?

``WORDINGS``: one row per wording of a backend or library, with its class and source;
``parse_oom`` parses the sizes a message carries. The classes (``conf.contract.FAILURE_CLASSES``):

* ``oom``: the allocator says it could not serve a request (the run's outcome ``oom``);
* ``memory_suspect``: a failure that usually means memory but does not say so; the run stays
  an ``error``, marked (the frontier sweeper can be told to read it as an OOM);
* ``error``: anything else, resource errors that are not memory capacity included.

No torch import: the exception type is matched by name. Sizes are written by c10's
``format_size`` ("N bytes", or "%.2f KiB|MiB|GiB" in powers of 1024): a parsed size is exact in
bytes, else accurate to half a unit of its last printed digit. A printed figure that no record
field holds (an unset limit printed as SIZE_MAX, an unsigned difference that wrapped) is null,
with the reason in ``oom_null_reason``: a parsed figure never makes an OOM's record invalid.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal
from typing import NamedTuple

_SIZE = r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB|TiB|KB|MB|GB)"
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 2**10, "MB": 2**20, "GB": 2**30}
"""Bytes per unit: c10's format_size prints KiB/MiB/GiB; the MPS allocator's own format_size printed
KB/MB/GB, also dividing by 1024 (aten/src/ATen/mps/MPSAllocator.mm format_size)."""

INT64_MAX = 2**63 - 1
"""The largest byte count a record field holds (the schema's maximum, Parquet's int64)."""

REASON_FIELD = "oom_null_reason"
"""The phase field that says why an ``oom_*_bytes`` the message printed is null."""


class Wording(NamedTuple):
    """One wording of a failure.

    Attributes:
        name: a short id (recorded as the phase's ``failure_wording``).
        fragment: a regular expression searched in the message (case-sensitive).
        failure_class: ``oom``, ``memory_suspect`` or ``error``.
        fields: record field -> regex group (1-based) of the size it fills, from ``fragment``.
        source: where the wording is written (file and function, or the library's doc).
    """

    name: str
    fragment: str
    failure_class: str
    fields: dict
    source: str


# First match wins: the negatives (resource errors that are not capacity) come first.
WORDINGS = (
    Wording(
        "triton_out_of_resource",
        r"out of resource: \w+",
        "error",
        {},
        "triton/runtime/errors.py OutOfResources: 'out of resource: {name}, Required: ..., "
        "Hardware limit: ...' (a kernel's shared memory or registers: not device capacity)",
    ),
    Wording(
        "cuda_illegal_address",
        r"an illegal memory access was encountered",
        "error",
        {},
        "cudaGetErrorString(cudaErrorIllegalAddress), CUDA runtime API: a bad pointer, not capacity",
    ),
    Wording(
        "caching_allocator",
        r"(?:CUDA|HIP|XPU) out of memory\. Tried to allocate " + _SIZE + r"\. GPU \d+ has a total capacity of "
        rf"{_SIZE} of which {_SIZE} is free\. .*?(?:{_SIZE} allowed; )?Of the allocated memory {_SIZE} is "
        rf"allocated by PyTorch, (?:with .*? allocated in private pools \(e\.g\., CUDA Graphs\), )?and {_SIZE} "
        r"is reserved by PyTorch but unallocated",
        "oom",
        {
            "oom_request_bytes": 1,
            "oom_total_bytes": 3,
            "oom_free_bytes": 5,
            "oom_limit_bytes": 7,
            "oom_allocated_bytes": 9,
            "oom_reserved_unallocated_bytes": 11,
        },
        "c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc (PyTorch >= 2.1; HIP on ROCm "
        "builds, hipified); c10/xpu/XPUCachingAllocator.cpp (XPU, same sentence)",
    ),
    Wording(
        "caching_allocator_legacy",
        r"(?:CUDA|HIP|XPU) out of memory\. Tried to allocate " + _SIZE + r" \(GPU \d+; "
        rf"{_SIZE} total capacity; {_SIZE} already allocated; (?:{_SIZE} free; )?(?:{_SIZE} allowed; )?"
        rf"{_SIZE} reserved in total by PyTorch",
        "oom",
        {
            "oom_request_bytes": 1,
            "oom_total_bytes": 3,
            "oom_allocated_bytes": 5,
            "oom_free_bytes": 7,
            "oom_limit_bytes": 9,
            "_reserved_total": 11,
        },
        "c10/cuda/CUDACachingAllocator.cpp before PyTorch 2.1 ('(GPU 0; ... total capacity; ... already "
        "allocated; ... free; ... reserved in total by PyTorch)'); intel-extension-for-pytorch's XPU "
        "allocator raises the same sentence as a RuntimeError (TORCH_CHECK)",
    ),
    Wording(
        "caching_allocator_cached",
        rf"CUDA out of memory\. Tried to allocate {_SIZE} \(GPU \d+; {_SIZE} total capacity; {_SIZE} already "
        rf"allocated; {_SIZE} free; {_SIZE} cached\)",
        "oom",
        {
            "oom_request_bytes": 1,
            "oom_total_bytes": 3,
            "oom_allocated_bytes": 5,
            "oom_free_bytes": 7,
            "oom_reserved_unallocated_bytes": 9,
        },
        "c10/cuda/CUDACachingAllocator.cpp malloc, PyTorch 1.0-1.3: '... free; ... cached)', cached = held by "
        "the allocator but not used by the program (the comment above the message)",
    ),
    Wording(
        "thc_out_of_memory",
        r"cuda runtime error \(2\) : out of memory",
        "oom",
        {},
        "aten/src/THC/THCGeneral.cpp THCudaCheck, PyTorch < 1.0: 'cuda runtime error (%d) : %s at %s:%d', "
        "2 = cudaErrorMemoryAllocation",
    ),
    Wording(
        "caching_allocator_short",
        r"(?:CUDA|HIP|XPU) out of memory",
        "oom",
        {},
        "the sentences above cut short (a wrapped or truncated message): the allocator's own first words",
    ),
    Wording(
        "cuda_malloc_async",
        rf"Allocation on device \d+ would exceed allowed memory\. \(out of memory\)\s*Currently allocated\s*: "
        rf"{_SIZE}\s*Requested\s*: {_SIZE}\s*Device limit\s*: {_SIZE}\s*Free \(according to CUDA\)\s*: {_SIZE}"
        rf"(?:\s*PyTorch limit \(set by user-supplied memory fraction\)\s*: {_SIZE})?",
        "oom",
        {
            "oom_allocated_bytes": 1,
            "oom_request_bytes": 3,
            "oom_total_bytes": 5,
            "oom_free_bytes": 7,
            "oom_limit_bytes": 9,
        },
        "c10/cuda/CUDAMallocAsyncAllocator.cpp mallocAsync (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)",
    ),
    Wording(
        "mps_allocator",
        rf"MPS backend out of memory \(MPS allocated: {_SIZE}, other allocations: {_SIZE}(?:, max allowed: "
        rf"{_SIZE})?\)\. Tried to allocate {_SIZE}",
        "oom",
        {"oom_allocated_bytes": 1, "oom_limit_bytes": 5, "oom_request_bytes": 7},
        "aten/src/ATen/mps/MPSAllocator.mm MPSHeapAllocatorImpl::alloc_buffer_block (TORCH_CHECK: a "
        "RuntimeError; 'max allowed' when PYTORCH_MPS_HIGH_WATERMARK_RATIO > 0)",
    ),
    Wording(
        "memsweep_cpu_tracker",
        r"CPU out of memory \(memsweep capacity_mode=allocator\)\. Tried to allocate [^(]*\((\d+) bytes\).*?"
        r"CPU capacity of [^(]*\((\d+) bytes\) of which [^(]*\((\d+) bytes\) is free\. Of the allocated memory "
        r"[^(]*\((\d+) bytes\)",
        "oom",
        {"oom_request_bytes": 1, "oom_limit_bytes": 2, "oom_free_bytes": 3, "oom_allocated_bytes": 4},
        "worker/counters/cpu.py LiveTensorTracker._refuse (memsweep's CPU allocator capacity)",
    ),
    Wording(
        "default_cpu_allocator",
        r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory): you tried to allocate (\d+) bytes",
        "oom",
        {"oom_request_bytes": 1},
        "c10/core/impl/alloc_cpu.cpp alloc_cpu: 'not enough memory' (Windows, Android), \"can't allocate "
        'memory" (posix_memalign)',
    ),
    Wording(
        "cuda_runtime_oom",
        "|".join(
            (
                r"(?:CUDA|HIP) error: out of memory",  # c10/cuda/CUDAException.h C10_CUDA_CHECK (hipified on ROCm)
                r"CUDA driver error: out of memory",  # aten/src/ATen/cuda/Exceptions.h AT_CUDA_DRIVER_CHECK
                r"hipErrorOutOfMemory",  # hip_runtime_api.h hipError_t, as hipGetErrorName prints it
            )
        ),
        "oom",
        {},
        "cudaGetErrorString(cudaErrorMemoryAllocation) and cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY) = 'out of "
        "memory' (a cudaMalloc outside the caching allocator); hipErrorOutOfMemory on ROCm",
    ),
    Wording(
        "nccl_cuda_oom",
        "|".join(
            (
                r"Cuda failure (?:\d+ )?'out of memory'",  # NCCL src/include/checks.h CUDACHECK's WARN
                r"Failed to CUDA calloc(?: async)? (\d+) bytes",  # NCCL src/include/alloc.h ncclCudaCalloc's WARN
            )
        ),
        "oom",
        {"oom_request_bytes": 1},
        "NCCL's last WARN, which PyTorch quotes after 'ncclUnhandledCudaError: Call to CUDA function failed.' "
        "(torch/csrc/distributed/c10d/NCCLUtils.cpp getNcclErrorDetailStr, ncclGetLastError)",
    ),
    Wording(
        "cublas_alloc_failed",
        r"CUBLAS_STATUS_ALLOC_FAILED",  # ATen/cuda/Exceptions.h TORCH_CUDABLAS_CHECK: 'CUDA error: ' + the enum
        "oom",
        {},
        "cuBLAS documentation, cublasStatus_t: 'Resource allocation failed inside the cuBLAS library'",
    ),
    Wording(
        "cudnn_alloc_failed",
        "|".join(
            (
                r"CUDNN_STATUS_ALLOC_FAILED",  # cudnn.h cudnnStatus_t (cuDNN < 9)
                r"CUDNN_STATUS_INTERNAL_ERROR_(?:HOST|DEVICE)_ALLOCATION_FAILED",  # cudnn_graph.h (cuDNN 9)
            )
        ),
        "oom",
        {},
        "cuDNN documentation, cudnnStatus_t: 'Resource allocation failed inside the cuDNN library'; "
        "ATen/cuda/Exceptions.h AT_CUDNN_CHECK: 'cuDNN error: ' + cudnnGetErrorString",
    ),
    Wording(
        "cufft_cusolver_alloc_failed",
        "|".join(
            (
                r"CUFFT_ALLOC_FAILED",  # cufft.h cufftResult; ATen/native/cuda/CuFFTUtils.h 'cuFFT error: '
                r"CUSOLVER_STATUS_ALLOC_FAILED",  # cusolver_common.h; ATen/cuda/Exceptions.h 'cusolver error: '
                r"CUSPARSE_STATUS_ALLOC_FAILED",  # cusparse.h; ATen/cuda/Exceptions.h TORCH_CUDASPARSE_CHECK
            )
        ),
        "oom",
        {},
        "cuFFT, cuSOLVER and cuSPARSE documentation: resource allocation failed inside the library",
    ),
    Wording(
        "miopen_alloc_failed",
        r"miopenStatusAllocFailed",  # MIOpen include/miopen/miopen.h miopenStatus_t, via miopenGetErrorString
        "oom",
        {},
        "MIOpen miopenStatus_t: miopenStatusAllocFailed 'Memory allocation error' (ROCm's cuDNN; PyTorch's "
        "MIOPEN_CHECK, aten/src/ATen/miopen/Exceptions.h: 'MIOpen error: ' + miopenGetErrorString)",
    ),
    Wording(
        "cublas_not_initialized",
        r"CUBLAS_STATUS_NOT_INITIALIZED",
        "memory_suspect",
        {},
        "cuBLAS documentation: cublasCreate fails with CUBLAS_STATUS_NOT_INITIALIZED when the CUDA runtime "
        "cannot give it its resources; at the edge of a full device that is its workspace (PyTorch's "
        "cublasCreate in aten/src/ATen/cuda/CublasHandlePool.cpp)",
    ),
    Wording(
        "cudnn_internal_or_execution",
        r"CUDNN_STATUS_(?:INTERNAL_ERROR|EXECUTION_FAILED|MAPPING_ERROR)",
        "memory_suspect",
        {},
        "cuDNN documentation, cudnnStatus_t: internal/execution failures, which cuDNN reports when a "
        "workspace or internal buffer it could not allocate",
    ),
    Wording(
        "onednn_primitive",
        r"could not create a primitive",
        "memory_suspect",
        {},
        "oneDNN (dnnl) via aten/src/ATen/native/mkldnn: a primitive whose scratchpad could not be allocated "
        "(seen under a small capacity_mode=process capacity, README)",
    ),
)
"""Every wording memsweep reads, with its class and source, the negatives first."""


def _size(number: str, unit: str | None) -> int:
    """Bytes of a printed size ("7.03", "GiB"; a bare byte count when ``unit`` is None), rounded to
    the byte (decimal arithmetic: exact however many digits were printed)."""
    if unit not in _UNITS:
        return int(number)
    return int((Decimal(number) * _UNITS[unit]).to_integral_value(ROUND_HALF_EVEN))


def _why_null(field: str, value: int, printed: str) -> str | None:
    """Why a parsed ``value`` (bytes) cannot be recorded, or None when a record field holds it.

    The fields are integers from 0 to INT64_MAX (``oom_reserved_unallocated_bytes`` may be
    negative: two rounded sizes' difference). An allocator prints a limit that is not set as
    SIZE_MAX (cudaMallocAsync's ``pytorch_memory_limits`` start at UINT64_MAX, printed as
    17179869184.00 GiB); any other figure past INT64_MAX is an unsigned sum that wrapped.
    """
    low = -INT64_MAX - 1 if field == "oom_reserved_unallocated_bytes" else 0
    if low <= value <= INT64_MAX:
        return None
    if field == "oom_limit_bytes" and value > INT64_MAX:
        return f"{field}: no limit set (printed {printed})"
    return f"{field}: printed {printed}, outside {low}..{INT64_MAX} B (no byte count a device holds)"


def _fields(w: Wording, m: re.Match) -> dict:
    """The record fields a matched wording fills: bytes, or None with ``REASON_FIELD`` saying why."""
    fields: dict = {}
    reasons = []
    for field, group in w.fields.items():
        if m.group(group) is None:
            continue
        unit = m.group(group + 1) if group < m.re.groups else None  # format_size's unit, or a byte count
        value = _size(m.group(group), unit)
        why = _why_null(field, value, " ".join(filter(None, (m.group(group), unit))))
        fields[field] = None if why else value
        if why and not field.startswith("_"):
            reasons.append(why)
    reserved = fields.pop("_reserved_total", None)
    if reserved is not None and fields.get("oom_allocated_bytes") is not None:
        fields["oom_reserved_unallocated_bytes"] = reserved - fields["oom_allocated_bytes"]
    if reasons:
        fields[REASON_FIELD] = "; ".join(reasons)
    return fields


def parse_oom(message: str) -> tuple[str, str | None, dict]:
    """Classify a failure message and read the sizes it states.

    Args:
        message: the exception's message.

    Returns:
        (class, wording name or None, fields): the class of the first matching ``WORDINGS`` row
        (``error`` when none matches); the fields it fills (``oom_request_bytes``,
        ``oom_allocated_bytes``, ``oom_free_bytes``, ``oom_total_bytes``,
        ``oom_reserved_unallocated_bytes``, ``oom_limit_bytes``; bytes), each only where the
        message states it (the legacy CUDA wording's reserved-but-unallocated is its "reserved in
        total" minus "already allocated"). A printed figure no record field holds (past
        INT64_MAX, or negative) is None, and ``oom_null_reason`` says why ("oom_limit_bytes: no
        limit set (printed 17179869184.00 GiB)"): a parsed figure never makes the record invalid.
    """
    for w in WORDINGS:
        m = re.search(w.fragment, message, re.DOTALL)
        if m is not None:
            return w.failure_class, w.name, _fields(w, m)
    return "error", None, {}


def classify_failure(exc: BaseException) -> str:
    """Return the class of ``exc``: ``"oom"``, ``"memory_suspect"`` or ``"error"``.

    Order: ``torch.OutOfMemoryError`` (matched by class name in the MRO, module ``torch``) and
    Python's ``MemoryError`` are ``oom``; a RuntimeError (MPS, intel-extension-for-pytorch's XPU
    and the CPU allocator raise plain RuntimeErrors) takes its message's class in ``WORDINGS``.
    Anything else is ``"error"``: another type carrying the words is a program's own text, not
    an allocator's.

    Args:
        exc: the exception a phase raised.

    Returns:
        One of ``conf.contract.FAILURE_CLASSES``.
    """
    for cls in type(exc).__mro__:
        if cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch"):
            return "oom"
    if isinstance(exc, MemoryError):
        return "oom"
    return parse_oom(str(exc))[0] if isinstance(exc, RuntimeError) else "error"
