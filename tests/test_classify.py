"""Failure classification: every wording memsweep reads (worker.classify.WORDINGS), its class and the
numbers parsed from it, with injected fake errors (no GPU needed). Each message below is the
wording of the source the table cites, with the sizes as c10's format_size prints them."""

import pytest
import torch

from memsweep.conf.contract import FAILURE_CLASSES, OOM_DETAIL_FIELDS
from memsweep.worker.classify import INT64_MAX, REASON_FIELD, WORDINGS, classify_failure, parse_oom

GiB, MiB = 2**30, 2**20


def size(x, unit):
    return round(x * unit)


CASES = [
    # (message, class, wording, parsed fields)
    (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.06 GiB "
        "is free. Including non-PyTorch memory, this process has 78.03 GiB memory in use. Of the allocated memory "
        "76.50 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "oom",
        "caching_allocator",
        dict(
            oom_request_bytes=2 * GiB,
            oom_total_bytes=size(79.10, GiB),
            oom_free_bytes=size(1.06, GiB),
            oom_allocated_bytes=size(76.50, GiB),
            oom_reserved_unallocated_bytes=size(1.02, GiB),
        ),
    ),
    (
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 15.51 GiB of which 149.62 MiB "
        "is free. Process 1839 has 322.23 MiB memory in use. Including non-PyTorch memory, this process has 11.65 GiB "
        "memory in use. 12.00 GiB allowed; Of the allocated memory 11.47 GiB is allocated by PyTorch, and 10.27 MiB "
        "is reserved by PyTorch but unallocated.",
        "oom",
        "caching_allocator",
        dict(
            oom_request_bytes=20 * MiB,
            oom_total_bytes=size(15.51, GiB),
            oom_free_bytes=size(149.62, MiB),
            oom_limit_bytes=12 * GiB,
            oom_allocated_bytes=size(11.47, GiB),
            oom_reserved_unallocated_bytes=size(10.27, MiB),
        ),
    ),
    (
        "HIP out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 191.98 GiB of which 0 bytes "
        "is free. Of the allocated memory 190.00 GiB is allocated by PyTorch, with 1.00 GiB allocated in private "
        "pools (e.g., CUDA Graphs), and 4.00 MiB is reserved by PyTorch but unallocated.",
        "oom",
        "caching_allocator",
        dict(
            oom_request_bytes=512 * MiB,
            oom_total_bytes=size(191.98, GiB),
            oom_free_bytes=0,
            oom_allocated_bytes=190 * GiB,
            oom_reserved_unallocated_bytes=4 * MiB,
        ),
    ),
    (
        "CUDA out of memory. Tried to allocate 7.03 GiB (GPU 0; 10.00 GiB total capacity; 2.46 GiB already allocated; "
        "5.26 GiB free; 3.00 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
        "max_split_size_mb to avoid fragmentation.",
        "oom",
        "caching_allocator_legacy",
        dict(
            oom_request_bytes=size(7.03, GiB),
            oom_total_bytes=10 * GiB,
            oom_allocated_bytes=size(2.46, GiB),
            oom_free_bytes=size(5.26, GiB),
            oom_reserved_unallocated_bytes=3 * GiB - size(2.46, GiB),
        ),
    ),
    (
        "XPU out of memory. Tried to allocate 1.00 GiB (GPU 0; 15.11 GiB total capacity; 13.50 GiB already "
        "allocated; 14.00 GiB reserved in total by PyTorch)",
        "oom",
        "caching_allocator_legacy",
        dict(
            oom_request_bytes=GiB,
            oom_total_bytes=size(15.11, GiB),
            oom_allocated_bytes=size(13.50, GiB),
            oom_reserved_unallocated_bytes=14 * GiB - size(13.50, GiB),
        ),
    ),
    (
        "XPU out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 15.11 GiB of which 512.00 MiB "
        "is free. Of the allocated memory 14.00 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch "
        "but unallocated. Please use `empty_cache` to release all unoccupied cached memory.",
        "oom",
        "caching_allocator",
        dict(
            oom_request_bytes=GiB,
            oom_total_bytes=size(15.11, GiB),
            oom_free_bytes=512 * MiB,
            oom_allocated_bytes=14 * GiB,
            oom_reserved_unallocated_bytes=100 * MiB,
        ),
    ),
    ("HIP out of memory. Tried to allocate 20.00 MiB", "oom", "caching_allocator_short", {}),
    (
        "Allocation on device 5 would exceed allowed memory. (out of memory)\nCurrently allocated     : 22.43 GiB\n"
        "Requested               : 4.07 GiB\nDevice limit            : 79.11 GiB\nFree (according to CUDA): 0 bytes\n"
        "PyTorch limit (set by user-supplied memory fraction)\n                        : 24.00 GiB",
        "oom",
        "cuda_malloc_async",
        dict(
            oom_allocated_bytes=size(22.43, GiB),
            oom_request_bytes=size(4.07, GiB),
            oom_total_bytes=size(79.11, GiB),
            oom_free_bytes=0,
            oom_limit_bytes=24 * GiB,
        ),
    ),
    (
        "MPS backend out of memory (MPS allocated: 9.06 GiB, other allocations: 384.00 KiB, max allowed: 18.13 GiB). "
        "Tried to allocate 256.00 MiB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper "
        "limit for memory allocations (may cause system failure).",
        "oom",
        "mps_allocator",
        dict(oom_allocated_bytes=size(9.06, GiB), oom_limit_bytes=size(18.13, GiB), oom_request_bytes=256 * MiB),
    ),
    (
        "MPS backend out of memory (MPS allocated: 9.06 GiB, other allocations: 1.00 GiB). Tried to allocate "
        "256.00 MiB on shared pool.",
        "oom",
        "mps_allocator",
        dict(oom_allocated_bytes=size(9.06, GiB), oom_request_bytes=256 * MiB),
    ),
    (
        "[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough memory: you tried to allocate "
        "1981808640 bytes.",
        "oom",
        "default_cpu_allocator",
        dict(oom_request_bytes=1981808640),
    ),
    (
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
        "allocate 25165824 bytes. Error code 12 (Cannot allocate memory)",
        "oom",
        "default_cpu_allocator",
        dict(oom_request_bytes=25165824),
    ),
    (
        "CPU out of memory (memsweep capacity_mode=allocator). Tried to allocate 26.00 MiB (27262976 bytes) in "
        "aten.mm.default. CPU capacity of 64.00 MiB (67108864 bytes) of which 10.00 MiB (10485760 bytes) is free. "
        "Of the allocated memory 54.00 MiB (56623104 bytes) is allocated by live tensors (memsweep tracker).",
        "oom",
        "memsweep_cpu_tracker",
        dict(
            oom_request_bytes=27262976,
            oom_limit_bytes=67108864,
            oom_free_bytes=10485760,
            oom_allocated_bytes=56623104,
        ),
    ),
    ("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported", "oom", "cuda_runtime_oom", {}),
    ("HIP error: out of memory", "oom", "cuda_runtime_oom", {}),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "oom", "cublas_alloc_failed", {}),
    ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "oom", "cudnn_alloc_failed", {}),
    ("cuFFT error: CUFFT_ALLOC_FAILED", "oom", "cufft_cusolver_alloc_failed", {}),
    (
        "cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`",
        "oom",
        "cufft_cusolver_alloc_failed",
        {},
    ),  # fmt: skip
    # probably memory, not said
    (
        "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
        "memory_suspect",
        "cublas_not_initialized",
        {},
    ),  # fmt: skip
    ("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR", "memory_suspect", "cudnn_internal_or_execution", {}),
    ("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED", "memory_suspect", "cudnn_internal_or_execution", {}),
    ("could not create a primitive", "memory_suspect", "onednn_primitive", {}),
    # negatives: resources that are not capacity, and ordinary errors
    (
        "out of resource: shared memory, Required: 98304, Hardware limit: 65536. Reducing block sizes or "
        "`num_stages` may help.",
        "error",
        "triton_out_of_resource",
        {},
    ),  # fmt: skip
    ("CUDA error: an illegal memory access was encountered", "error", "cuda_illegal_address", {}),
    ("CUDA error: device-side assert triggered", "error", None, {}),
    ("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)", "error", None, {}),
    ("Expected all tensors to be on the same device", "error", None, {}),
]


ASYNC = (
    "Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated     : 22.43 GiB\n"
    "Requested               : 4.07 GiB\nDevice limit            : 79.11 GiB\nFree (according to CUDA): 0 bytes\n"
    "PyTorch limit (set by user-supplied memory fraction)\n                        : {limit}"
)
NCCL = (
    "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with "
    "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
    "Last error:\n{last}"
)
ASYNC_FIELDS = dict(
    oom_allocated_bytes=size(22.43, GiB), oom_request_bytes=size(4.07, GiB), oom_total_bytes=size(79.11, GiB)
)

# Each message as its source writes it (the id names the source); the negatives after.
LIBRARY_CASES = [
    pytest.param(
        ASYNC.format(limit="17179869184.00 GiB"),  # pytorch_memory_limits = UINT64_MAX until a fraction is set
        "oom",
        "cuda_malloc_async",
        dict(
            ASYNC_FIELDS,
            oom_free_bytes=0,
            oom_limit_bytes=None,
            oom_null_reason="oom_limit_bytes: no limit set (printed 17179869184.00 GiB)",
        ),
        id="CUDAMallocAsyncAllocator.cpp-mallocAsync-no-memory-fraction",
    ),
    pytest.param(
        "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which 0 bytes "
        "is free. Of the allocated memory 70.00 GiB is allocated by PyTorch, with 1.00 GiB allocated in private "
        "pools (e.g., CUDA Graphs), and 17179869183.00 GiB is reserved by PyTorch but unallocated.",
        "oom",
        "caching_allocator",
        dict(
            oom_request_bytes=2 * MiB,
            oom_total_bytes=size(79.10, GiB),
            oom_free_bytes=0,
            oom_allocated_bytes=70 * GiB,
            oom_reserved_unallocated_bytes=None,
            oom_null_reason=f"oom_reserved_unallocated_bytes: printed 17179869183.00 GiB, outside "
            f"{-INT64_MAX - 1}..{INT64_MAX} B (no byte count a device holds)",
        ),
        id="CUDACachingAllocator.cpp-malloc-size_t-difference-wrapped",
    ),
    pytest.param(
        "CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; 8.57 GiB already "
        "allocated; 9.25 MiB free; 1.23 GiB cached)",
        "oom",
        "caching_allocator_cached",
        dict(
            oom_request_bytes=size(12.50, MiB),
            oom_total_bytes=size(10.92, GiB),
            oom_allocated_bytes=size(8.57, GiB),
            oom_free_bytes=size(9.25, MiB),
            oom_reserved_unallocated_bytes=size(1.23, GiB),
        ),
        id="CUDACachingAllocator.cpp-malloc-PyTorch-1.0-1.3-cached",
    ),
    pytest.param(
        "cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/generic/THCStorage.cu:58",
        "oom",
        "thc_out_of_memory",
        {},
        id="THCGeneral.cpp-THCudaCheck-PyTorch-0.4",
    ),
    pytest.param(
        "MPS backend out of memory (MPS allocated: 18.04 GB, other allocations: 3.78 MB, max allowed: 18.13 GB). "
        "Tried to allocate 256 bytes on shared pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper "
        "limit for memory allocations (may cause system failure).",
        "oom",
        "mps_allocator",
        dict(oom_allocated_bytes=size(18.04, GiB), oom_limit_bytes=size(18.13, GiB), oom_request_bytes=256),
        id="MPSAllocator.mm-own-format_size-KB-MB-GB",
    ),
    pytest.param(
        "CUDA driver error: out of memory",
        "oom",
        "cuda_runtime_oom",
        {},
        id="ATen-cuda-Exceptions.h-AT_CUDA_DRIVER_CHECK",
    ),
    pytest.param(
        "HIP error: hipErrorOutOfMemory", "oom", "cuda_runtime_oom", {}, id="hip_runtime_api.h-hipErrorOutOfMemory-name"
    ),
    pytest.param(
        NCCL.format(last="Cuda failure 'out of memory'"),
        "oom",
        "nccl_cuda_oom",
        {},
        id="NCCL-checks.h-CUDACHECK-via-NCCLUtils.cpp-getNcclErrorDetailStr",
    ),
    pytest.param(
        NCCL.format(last="Cuda failure 2 'out of memory'"),
        "oom",
        "nccl_cuda_oom",
        {},
        id="NCCL-checks.h-CUDACHECK-code",
    ),
    pytest.param(
        NCCL.format(last="Failed to CUDA calloc async 6291456 bytes"),
        "oom",
        "nccl_cuda_oom",
        dict(oom_request_bytes=6291456),
        id="NCCL-alloc.h-ncclCudaCalloc",
    ),
    pytest.param(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul( ltHandle, computeDesc.descriptor(), "
        "&alpha_val, mat1_ptr, Adesc.descriptor(), ...)`",
        "oom",
        "cublas_alloc_failed",
        {},
        id="ATen-cuda-Exceptions.h-TORCH_CUDABLAS_CHECK-cublasLt",
    ),
    pytest.param(
        "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
        "oom",
        "cudnn_alloc_failed",
        {},
        id="cudnn_graph.h-cuDNN-9-AT_CUDNN_CHECK",
    ),
    pytest.param(
        "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
        "oom",
        "cudnn_alloc_failed",
        {},
        id="cudnn_graph.h-cuDNN-9-host",
    ),
    pytest.param(
        "CUDA error: CUSPARSE_STATUS_ALLOC_FAILED when calling `cusparseCreate(handle)`",
        "oom",
        "cufft_cusolver_alloc_failed",
        {},
        id="ATen-cuda-Exceptions.h-TORCH_CUDASPARSE_CHECK",
    ),
    pytest.param(
        "MIOpen error: miopenStatusAllocFailed", "oom", "miopen_alloc_failed", {}, id="MIOpen-miopen.h-miopenStatus_t"
    ),
    # negatives: failures of the same libraries that are not capacity
    pytest.param(
        NCCL.format(last="Cuda failure 'an illegal memory access was encountered'"),
        "error",
        "cuda_illegal_address",
        {},
        id="NCCL-CUDACHECK-illegal-address-not-oom",
    ),
    pytest.param(
        NCCL.format(last="Cuda failure 'invalid device ordinal'"), "error", None, {}, id="NCCL-invalid-device-not-oom"
    ),
    pytest.param(
        "NCCL error: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device "
        "error. \nLast error:\nsocketStartConnect: Connect to 10.0.0.2<43211> failed : Connection refused",
        "error",
        None,
        {},
        id="NCCLUtils.cpp-ncclSystemError-says-malloc-not-oom",
    ),
    pytest.param(
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input.",
        "error",
        None,
        {},
        id="ATen-cuda-Exceptions.h-AT_CUDNN_CHECK-not-supported",
    ),
    pytest.param("cuDNN error: CUDNN_STATUS_BAD_PARAM", "error", None, {}, id="cudnnStatus_t-bad-param"),
    pytest.param(
        "CUDA error: CUBLAS_STATUS_INVALID_VALUE when calling `cublasSgemm( handle, opa, opb, m, n, k, ...)`",
        "error",
        None,
        {},
        id="TORCH_CUDABLAS_CHECK-invalid-value",
    ),
    pytest.param("cuFFT error: CUFFT_INVALID_SIZE", "error", None, {}, id="CuFFTUtils.h-invalid-size"),
    pytest.param("MIOpen error: miopenStatusBadParm", "error", None, {}, id="MIOpen-bad-parm"),
    pytest.param(
        "Expected more than 1 value per channel when training, got input size torch.Size([1, 8])",
        "error",
        None,
        {},
        id="torch-nn-functional-batch_norm-shape",
    ),
]


def _param(case):
    return case.values if hasattr(case, "values") else case


@pytest.mark.parametrize("message, cls, wording, fields", CASES + LIBRARY_CASES)
def test_every_wording_its_class_and_numbers(message, cls, wording, fields):
    assert parse_oom(message) == (cls, wording, fields)
    assert classify_failure(RuntimeError(message)) == cls
    assert set(fields) <= set(OOM_DETAIL_FIELDS) | {REASON_FIELD}
    recorded = {k: v for k, v in fields.items() if k != REASON_FIELD}
    assert all(v is None or -INT64_MAX - 1 <= v <= INT64_MAX for v in recorded.values())
    assert (REASON_FIELD in fields) == (None in recorded.values())  # a null figure always says why


@pytest.mark.parametrize("limit", ["24.00 GiB", "17179869184.00 GiB", "99999999999999999999999999999.99 GiB"])
def test_an_async_limit_is_bytes_or_null_with_its_reason(limit):
    _, _, fields = parse_oom(ASYNC.format(limit=limit))
    if limit == "24.00 GiB":
        assert fields["oom_limit_bytes"] == 24 * GiB and REASON_FIELD not in fields
    else:
        assert fields["oom_limit_bytes"] is None and fields[REASON_FIELD].startswith("oom_limit_bytes: no limit set")


def test_every_wording_of_the_table_is_covered_and_cited():
    assert {w.name for w in WORDINGS} == {_param(c)[2] for c in CASES + LIBRARY_CASES if _param(c)[2]}
    for w in WORDINGS:
        assert w.failure_class in FAILURE_CLASSES and len(w.source) > 20


def test_torch_out_of_memory_error_type():
    assert classify_failure(torch.OutOfMemoryError("anything")) == "oom"
    assert classify_failure(MemoryError()) == "oom"


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("CUDA out of memory"),  # not a RuntimeError: a user's own error text, not the allocator
        KeyError("x"),
    ],
)
def test_other_errors_are_not_oom(exc):
    assert classify_failure(exc) == "error"
