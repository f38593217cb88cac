"""The field's names, written once: axes, dtypes, modes, phases, outcomes, options, isolation.

Every process (the sweeper, the worker, the analysis) spells these names the same way
because it imports them from here. Standard library only; nothing here computes anything.
"""

from __future__ import annotations

# ---- the load --------------------------------------------------------------------------

AXES = ("batch", "context", "width", "dtype", "eval_batch", "world_size")
"""What a sweep may vary, one at a time (the ``sweep.axes`` of the ovat sweeper). ``eval_batch``
(the batch of a training run's ``eval`` phase) sizes only that phase (``PHASE_SIZE_VARIABLES``).
``world_size`` (ranks of a DDP or FSDP run, spec ``parallel``): what each rank holds shrinks as
it grows under FSDP (its frontier reads "does the fullest rank fit" at each world size)."""

NUMERIC_AXES = ("batch", "context", "width", "eval_batch")
"""The axes with an order, whose success/OOM edge a search can find (frontier sweeper, ``memsweep predict``)."""

INTEGER_AXES = (*NUMERIC_AXES, "world_size")
"""The axes whose values are integers: a frontier row gives their edge as numbers (the dtype axis
gives labels). ``world_size`` is swept, not searched: under FSDP more ranks hold less each, so
"larger is harder" does not hold for it (``AXIS_DIRECTIONS``)."""

DTYPES = ("float32", "float16", "bfloat16")
"""Accepted ``dtype`` values of a run (torch dtype names)."""

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per element of each of ``DTYPES`` (``torch.finfo(dtype).bits // 8``)."""

MODES = ("inference", "train", "generate")
"""What a run does with its model: forward passes, training steps, or prefill + decode."""

WORKLOADS = ("mlp", "transformer", "hf", "user")
"""Built-in workload names (``workload.name``)."""

GENERATE_WORKLOADS = ("transformer", "hf")
"""The workloads with a KV cache: the only ones ``mode=generate`` accepts."""

DRY_RUN_WORKLOADS = ("mlp", "transformer", "hf", "user")
"""The workloads a dry run (fake tensors) covers; mlp and transformer are checked against
measured runs (tests/test_dry_run.py), hf on shrunk Llama, GPT-2, Qwen2, Mistral and Phi-3
configs (tests/test_dry_run_hf.py)."""

WIDTH_WORKLOADS = ("mlp", "transformer", "user")
"""The workloads that read the load's ``width``: the mlp's feature size, the transformer's hidden
size (unless ``workload.hidden`` is set), a user workload's (passed to its functions). The hf
workload's model comes from its config and overrides alone: width changes nothing there."""

DYNAMO_FREE_WORKLOADS = ("mlp", "transformer")
"""The built-in workloads whose CPU runs never reach ``torch._dynamo`` (checked by
tests/test_dynamo_import.py for every mode but train)."""

ACTIVATIONS = ("gelu", "relu", "silu", "tanh")
"""``workload.activation`` of the mlp workload."""

ATTENTIONS = ("sdpa", "eager")
"""``workload.attention`` of the transformer and hf workloads."""

NORMS = ("rmsnorm", "layernorm")
"""``workload.norm`` of the transformer workload."""

FFN_KINDS = ("gelu", "swiglu")
"""``workload.ffn`` of the transformer workload."""

# ---- mode options (RunSpec fields, documented there) -----------------------------------

PRECISIONS = ("auto", "pure", "autocast", "mixed")
"""``precision`` as given: ``pure`` (everything in ``dtype``), ``autocast`` (float32 weights,
gradients and optimizer states, compute under ``torch.autocast(dtype)``), ``mixed`` (the same as
``autocast``) or ``auto`` (``autocast`` for a training run in float16 or bfloat16, else ``pure``:
``conf.contract.spec.resolve_precision``)."""

PRECISION_ALIASES = {"mixed": "autocast"}
"""Other names of a resolved ``precision``."""

RECIPE_DTYPES = {"float32": "32", "float16": "16", "bfloat16": "bf16"}
"""dtype -> the first half of its precision recipe's name (Lightning's ``32``, ``16``, ``bf16``)."""
RECIPE_KINDS = {"pure": "true", "autocast": "mixed"}
"""The training precision recipe as Lightning's ``Trainer(precision=...)`` names it:
``RECIPE_DTYPES[dtype] + "-" + RECIPE_KINDS[precision]``, e.g. ``bf16-mixed`` (float32 master
weights and optimizer states, bfloat16 compute) and ``bf16-true`` (weights, gradients and
optimizer states in bfloat16); float32 is ``32-true``."""

OPTIMIZERS = ("adamw", "sgd", "adafactor", "adamw8bit")
"""``optimizer`` of a training run."""

KV_CACHES = ("dynamic", "static")
"""``kv_cache`` of a generate run: grown token by token, or preallocated at the prefill."""

CAPACITY_MODES = ("allocator", "process")
"""What an emulated capacity caps (spec ``capacity_mode``): the allocator's bytes (a GPU
capacity's meaning; on the CPU the worker's count of live tensor storage bytes) or, on the
CPU only, the whole process (RLIMIT_DATA: does this process fit in N bytes of RAM)."""

PARALLELS = ("none", "ddp", "fsdp")
"""``parallel``: one process; DistributedDataParallel; FSDP2 ``fully_shard`` per block and at the root
(one rank process per ``world_size``)."""

PARALLEL_WORKLOADS = ("mlp", "transformer")
"""The workloads ``parallel`` ddp/fsdp accepts: their blocks are ``model.blocks`` (FSDP's units)."""

DIRECTIONS = ("increasing", "decreasing", "constant")
"""How a rank's load follows an axis' value: ``increasing`` (a larger value needs more memory:
success below the edge, OOM above; the frontier's ``max_ok``/``min_oom``), ``decreasing`` (a
larger value needs less: success above the edge, OOM below; ``min_ok``/``max_oom``), ``constant``
(nominally the same load at every value: read like ``increasing``, where an edge can only come
from what grows with the value beside the load, e.g. the ranks' communication buffers)."""

AXIS_DIRECTIONS = {
    **{axis: dict.fromkeys(PARALLELS, "increasing") for axis in AXES if axis != "world_size"},
    "world_size": {"none": "increasing", "ddp": "constant", "fsdp": "decreasing"},
}
"""Axis -> ``parallel`` -> its direction (``DIRECTIONS``), written once for the frontier and the
search. ``world_size`` under FSDP: each rank holds 1/world_size of the parameters, gradients and
optimizer states (FSDP2 ``fully_shard``), so more ranks need less each; under DDP each rank
holds a whole replica and its own micro-batch (``batch`` is per rank), so its load does not
depend on how many ranks there are; with ``parallel=none`` world_size is always 1."""


def axis_direction(axis: str, parallel: str | None = None) -> str:
    """The direction (``DIRECTIONS``) of ``axis`` in a run of ``parallel`` (``AXIS_DIRECTIONS``).

    Args:
        axis: one of ``AXES``.
        parallel: the runs' ``parallel`` (``PARALLELS``); None (a table without it) reads as ``none``.

    Returns:
        ``increasing``, ``decreasing`` or ``constant``.

    Raises:
        KeyError: an axis or parallel this vocabulary does not name.
    """
    return AXIS_DIRECTIONS[axis][parallel or "none"]


FAULT_KINDS = ("raise", "oom", "sigkill", "segfault", "hang", "garbage", "orphans")
"""Failures a spec's ``fault`` may inject into one phase (for testing memsweep itself); ``orphans``:
the worker starts children (one forked, one a new program, one a new program in a session of its
own) that sleep, then kills itself."""

# ---- phases ----------------------------------------------------------------------------
# A training step and a generation are split into sub-phases, each its own protocol window,
# recorded as "<parent>.<sub_phase>" (e.g. "cold_step.backward") with the fields parent,
# sub_phase, step and micro_step. warmup runs whole steps (or generations) in one window: the
# loop with its real ordering, without the sub-phase boundaries.

STEP_SUB_PHASES = ("forward", "loss", "backward", "optimizer_step")
"""The sub-phases of a training step, in order."""

GENERATE_SUB_PHASES = ("prefill", "decode")
"""The sub-phases of a generation, in order."""

USER_STEP_SUB_PHASES = ("user_step",)
"""The one sub-phase of a training step run by the user's own function (user workload,
``workload.train_step``): memsweep cannot see inside it, so forward, loss, backward and
optimizer_step are not recorded (missing, never zero)."""

TRAIN_STEP_KINDS = ("memsweep", "user")
"""Who runs a training run's steps (the record's ``train_step``): memsweep's own loop, split into
``STEP_SUB_PHASES``, or the user's ``workload.train_step``, recorded as ``USER_STEP_SUB_PHASES``."""

AFTER_PHASES = ("eval", "export")
"""Optional phases after the warm phase, each its own phase, in order."""


def sub_phase_names(parent: str, subs: tuple[str, ...]) -> tuple[str, ...]:
    """The recorded names of a parent phase's sub-phases.

    Args:
        parent: the parent phase (``cold_step``, ``warm_generate``...).
        subs: its sub-phases (``STEP_SUB_PHASES`` or ``GENERATE_SUB_PHASES``).

    Returns:
        ``"<parent>.<sub>"`` for each sub-phase, in order.
    """
    return tuple(f"{parent}.{sub}" for sub in subs)


INFERENCE_PHASES = ("model_load", "inputs", "cold_forward", "warmup", "warm_forward")
"""The phases of an inference run, in order."""

TRAIN_PHASES = (
    "model_load",
    "inputs",
    *sub_phase_names("cold_step", STEP_SUB_PHASES),
    "warmup",
    *sub_phase_names("warm_step", STEP_SUB_PHASES),
)
"""The phases of a training run, in order (each name once; ``warm_step.*`` repeats)."""

USER_TRAIN_PHASES = (
    "model_load",
    "inputs",
    *sub_phase_names("cold_step", USER_STEP_SUB_PHASES),
    "warmup",
    *sub_phase_names("warm_step", USER_STEP_SUB_PHASES),
)
"""The phases of a training run whose steps are the user's ``workload.train_step``, in order."""

GENERATE_PHASES = (
    "model_load",
    "inputs",
    *sub_phase_names("cold_generate", GENERATE_SUB_PHASES),
    "warmup",
    *sub_phase_names("warm_generate", GENERATE_SUB_PHASES),
)
"""The phases of a generate run, in order (each name once; ``warm_generate.*`` repeats)."""

PARENT_PHASES = ("cold_step", "warm_step", "cold_generate", "warm_generate")
"""The phases split into sub-phases (a phase record's ``parent``)."""

COLD_PHASES = ("cold_forward", "cold_step", "cold_generate")
"""The first pass of each mode: a phase, or the parent of sub-phases."""

WARM_PHASES = ("warm_forward", "warm_step", "warm_generate")
"""The repeated (warm) pass of each mode: a phase, or the parent of sub-phases."""

ALL_PHASES = tuple(
    dict.fromkeys(INFERENCE_PHASES + TRAIN_PHASES + USER_TRAIN_PHASES + GENERATE_PHASES + PARENT_PHASES + AFTER_PHASES)
)
"""Every name a fault may target: a phase, or a parent (its first sub-phase is hit)."""

# ---- which load variables set each phase's size ----------------------------------------
# An axis' frontier counts an OOM only when the phase that failed scales with that axis
# (conf.contract.attribution). What sets a phase's size is what its own allocations grow with;
# memory an earlier phase left live is not counted (an eval that fails because the training
# batch left large tensors behind is still read as an eval failure).

STEP_VARIABLES = ("batch", "context", "width", "dtype", "world_size")
"""What sets the size of a forward pass or a training step (every sub-phase): the inputs
(batch, context, width), the model (width, dtype) and, in a DDP or FSDP run, the ranks it is
split over (world_size: FSDP's shards, the gradient buckets)."""

PHASE_SIZE_VARIABLES = {
    "model_load": ("width", "dtype", "world_size"),
    "inputs": STEP_VARIABLES,
    "cold_forward": STEP_VARIABLES,
    "warm_forward": STEP_VARIABLES,
    "warmup": STEP_VARIABLES + ("new_tokens",),
    **{sub: STEP_VARIABLES for sub in STEP_SUB_PHASES + USER_STEP_SUB_PHASES},
    "prefill": ("context", "batch", "width", "dtype"),
    "decode": ("new_tokens", "context", "batch", "width", "dtype"),
    "eval": ("eval_batch", "context", "width", "dtype", "world_size"),
    "export": ("width", "dtype", "world_size"),
}
"""Phase (a sub-phase by its own name: ``cold_step.backward`` is ``backward``) -> the load
variables that set its size, the one that names it first (an eval failure is reported "at
eval_batch=N"). Training steps: batch, context, width, dtype; eval: eval_batch and context (and
the model); prefill: context; decode: context + new_tokens (both also batch: the KV cache is
batch x tokens); export: the model. warmup runs whole steps or generations. A phase not listed
(``setup``, a record without a failed phase) is taken to scale with every variable."""

# ---- outcomes and counters -------------------------------------------------------------

CUDA_BLOCK_BYTES = 512
"""The CUDA caching allocator's smallest block, bytes: every request is rounded up to a multiple
of it, and torch.cuda.memory_allocated / max_memory_allocated count those rounded blocks
(PyTorch c10/cuda/CUDACachingAllocator.cpp: ``kMinBlockSize = 512``, ``round_size``; with the
default allocator settings, i.e. no ``roundup_power2_divisions`` in PYTORCH_CUDA_ALLOC_CONF).
The worker's dry run predicts with it, the estimator calculates with it."""

OUTCOMES = ("ok", "oom", "error", "crash", "timeout")
"""Outcome of a run. Only ``oom`` says "does not fit"; a crash or an error is never an OOM."""

WORKER_OUTCOMES = ("ok", "oom", "error")
"""The outcomes a worker writes in its own record (crash and timeout are the sweeper's findings)."""

FORK_SERVER_LOST = "ForkServerLost"
"""A crash's ``error_type`` when the fork server (or a run's handler) went away, stopped or
wedged before the worker's exit status came: not the load's doing."""

LAUNCHER_WORKER_LOST = "LauncherWorkerLost"
"""A crash's ``error_type`` when the launcher's worker process running the job (a joblib/loky
worker, a SLURM job cancelled or failed) died while the run was in flight: not the load's doing;
a resume runs it again."""

SLURM_TIME_LIMIT = "SlurmTimeLimit"
"""A ``timeout``'s ``error_type`` when SLURM ended the run's job at its time limit
(``hydra.launcher.timeout_min``): finished, not run again on resume."""

COUNTERS = ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved")
"""PyTorch's four memory counters (torch.cuda.memory_allocated...), bytes, read by every phase."""

PEAK_COUNTERS = ("max_memory_allocated", "max_memory_reserved")
"""The two peak counters; a run's peak compared with the capacity is one of them
(``conf.contract.rundir.peak_counters``)."""

DEVICE_COUNTERS = (
    "memory_allocated_start",
    "memory_reserved_start",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
)
"""The counters of one phase (bytes, null when unreadable): both current values at its start,
both current values at its end, both peaks. A run on several devices records them per device
too (phase field ``devices``: ``device_index`` and these)."""

PEAK_CATEGORIES = (
    ("parameter", "predicted_parameter_bytes"),
    ("gradient", "predicted_gradient_bytes"),
    ("optimizer_state", "predicted_optimizer_state_bytes"),
    ("activation", "predicted_activation_bytes"),
)
"""A dry run's phase peak split by category: (category, record field). The categories of
torch.distributed._tools.mem_tracker (_MemRefType: PARAM, GRAD, OPT; its BUFFER, INP, ACT,
TEMP and OTH are the fourth here); each field holds the bytes live at the moment of the
phase's predicted peak (max_memory_allocated), and the four sum to that peak. Null in the
record of a measured run."""

PEAK_SPLIT_FIELDS = tuple(field for _, field in PEAK_CATEGORIES)
"""The record fields of ``PEAK_CATEGORIES``, in order."""

PEAK_CATEGORY_WORDS = {
    "parameter": "parameters",
    "gradient": "gradients",
    "optimizer_state": "optimizer states",
    "activation": "activations and temporaries",
}
"""How people read each ``PEAK_CATEGORIES`` category, wherever a peak's split is printed
(``memsweep predict``, the report's split of the peak): the last holds every other live tensor."""

ESTIMATE_KEYS = (
    "weights",
    "gradients",
    "optimizer_states",
    "activations",
    "kv_cache",
    "temporaries",
    "reserve",
    "peak",
    "total",
)
"""Keys of a spec's ``estimate`` (estimator/ ``Breakdown.to_dict``): bytes or null."""

SOURCES = ("measured", "predicted")
"""A record's ``source``: the counters of a real run, or a dry run's prediction on fake tensors."""

# ---- how a run is started ---------------------------------------------------------------

ISOLATION_SPAWN = "spawn"
"""Isolation by a new interpreter per run (``python -m memsweep.worker SPEC``)."""

WORKER_COMMAND = ("-m", "memsweep.worker")
"""The interpreter's arguments before the spec's path that start a spawned worker
(``ISOLATION_SPAWN``): ``sys.executable -m worker SPEC`` (``sweeper.launch``, ``worker.launch``)."""

FORKSERVER_NO_PRELOAD = "--no-preload"
"""The fork server's third argument (``python -m memsweep.worker.forkserver SOCKET PARENT --no-preload``)
for a server that imports torch only when a run is to be forked: one started for
``ISOLATION_SPAWN``, whose runs are new interpreters that import torch themselves."""

FORKSERVER_KILL_REQUEST = "kill"
"""The line a fork-server client sends before it hangs up when it was interrupted (SIGINT): the
run's handler then kills the run instead of keeping it (``worker.forkserver``); a client that
dies without a word (a launcher worker killed) leaves its run kept."""

ISOLATION_FORKSERVER = "forkserver"
"""Isolation by a fork of a server that imported torch but never touched a device."""

ISOLATIONS = (ISOLATION_SPAWN, ISOLATION_FORKSERVER)
"""Accepted ``isolation`` settings. Either way every run is a fresh process."""

DEFAULT_ISOLATION = ISOLATION_FORKSERVER
"""The isolation of a run when none is chosen (conf/config.yaml says the same; README: why)."""

ISOLATION_ENV = "MEMSWEEP_ISOLATION"
"""Environment variable through which the sweeper tells the worker how it was started; a worker
started without it (by hand, ``python -m memsweep.worker SPEC``) was started as ``ISOLATION_SPAWN``."""

LEASE_LOCKS_ENV = "MEMSWEEP_LEASE_LOCKS"
"""Environment variable naming the lock files of a run's device lease (``sweeper.pool``; paths
joined by ``os.pathsep``), so that a fork-server handler whose client went away holds the lease
for the run until the run ends (``worker.forkserver``): no other run is given its device meanwhile."""

PARENT_ENV = "MEMSWEEP_PARENT_PID"
"""Environment variable naming the process a worker must die with (the process that started
it: the fork server's handler for a forked worker and for a spawned one in a sweep, else the
orchestrator that spawned it);
the worker checks it after arming PR_SET_PDEATHSIG, so that a parent that died just before
is not missed (``worker.lifecycle.die_with_parent``)."""
