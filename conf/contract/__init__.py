"""The contract between memsweep's processes: conf -> sweeper -> worker -> record file -> analysis.

Standard library only, so that the sweeper (Hydra, no torch), the worker (torch, no Hydra)
and the analysis (pandas, no torch) all import it without pulling in each other's
dependencies. Modules, by job:

* ``vocabulary``: the field's names (axes, dtypes, modes, phases, outcomes, options, isolation);
* ``units``: bytes, GB and GiB, size texts;
* ``errors``: SpecError (bad input: field, value, accepted) and RecordError (unreadable file);
* ``checks``, ``workload``, ``spec``: the run spec and its validation;
* ``record``: the record's and the result envelope's fields, declared once, the JSON files;
* ``rundir``: the one reader of a run directory and the one definition of the run's peak;
* ``exits``: exit statuses; ``host``: /proc readers.

Callers import ``from conf.contract import X`` (or from a submodule).
"""

from .errors import NewerSchemaError, RecordError, SpecError
from .exits import (EXIT_BAD_INPUT, EXIT_BAD_SPEC, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_OOM, EXIT_UNAVAILABLE,
                    RUN_EXIT)
from .host import meminfo_bytes, proc_kb_field
from .record import (CAPACITY_FIELDS, DEVICE_FIELDS, ENVIRONMENT_FIELDS, EXTRA_COUNTERS, FILE_KINDS, MODEL_FIELDS,
                     OOM_DETAIL_FIELDS, PHASE_COUNTERS, PHASE_FIELDS, RECORD_FIELDS, RECORD_FILE, RESULT_FIELDS,
                     RESULT_FILE, RUN_FILES, SCHEMA_VERSION, SEARCH_LOG, SIZE_FIELDS, SPEC_FILE, STDERR_FILE,
                     STDOUT_FILE, SUB_PHASE_FIELDS, Field, classify_run, field_names, read_json, write_json_atomic)
from .rundir import (CPU_PEAK_COUNTERS, CUDA_PEAK_COUNTERS, Run, device_kind_of, find_run_dirs, peak_counters,
                     phase_peak, read_file, read_run, read_spec, record_phases, run_peak, try_read)
from .spec import MAX_DEVICES, RunSpec, needs_dynamo, validate_device, validate_estimate
from .units import GB, SIZE_UNITS, GiB, bytes_text, gib, parse_size
from .vocabulary import (ACTIVATIONS, AFTER_PHASES, ALL_PHASES, ATTENTIONS, AXES, CAPACITY_MODES, COLD_PHASES,
                         COUNTERS, DEFAULT_ISOLATION, DEVICE_COUNTERS, DRY_RUN_WORKLOADS, DTYPES, DTYPE_BYTES,
                         DYNAMO_FREE_WORKLOADS, ESTIMATE_KEYS, FAULT_KINDS, FFN_KINDS, GENERATE_PHASES,
                         GENERATE_SUB_PHASES, GENERATE_WORKLOADS, INFERENCE_PHASES, ISOLATIONS, ISOLATION_ENV,
                         ISOLATION_FORKSERVER, ISOLATION_SPAWN, KV_CACHES, MODES, NORMS, NUMERIC_AXES, OPTIMIZERS,
                         OUTCOMES, PARENT_PHASES, PEAK_CATEGORIES, PEAK_COUNTERS, PEAK_SPLIT_FIELDS, PRECISIONS,
                         SOURCES, STEP_SUB_PHASES, TRAIN_PHASES, WARM_PHASES, WORKER_OUTCOMES, WORKLOADS,
                         sub_phase_names)
from .workload import WORKLOAD_PARAMS, hf_config_kind, validate_workload

__all__ = [
    "ACTIVATIONS", "AFTER_PHASES", "ALL_PHASES", "ATTENTIONS", "AXES", "CAPACITY_FIELDS", "CAPACITY_MODES",
    "COLD_PHASES", "COUNTERS", "CPU_PEAK_COUNTERS", "CUDA_PEAK_COUNTERS", "DEFAULT_ISOLATION", "DEVICE_COUNTERS",
    "DEVICE_FIELDS", "DRY_RUN_WORKLOADS", "DTYPES", "DTYPE_BYTES", "DYNAMO_FREE_WORKLOADS", "ENVIRONMENT_FIELDS",
    "ESTIMATE_KEYS", "EXIT_BAD_INPUT", "EXIT_BAD_SPEC", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_OOM",
    "EXIT_UNAVAILABLE", "EXTRA_COUNTERS", "FAULT_KINDS", "FFN_KINDS", "FILE_KINDS", "GB", "GENERATE_PHASES",
    "GENERATE_SUB_PHASES", "GENERATE_WORKLOADS", "INFERENCE_PHASES", "ISOLATIONS", "ISOLATION_ENV",
    "ISOLATION_FORKSERVER", "ISOLATION_SPAWN", "KV_CACHES", "MAX_DEVICES", "MODEL_FIELDS", "MODES", "NORMS",
    "NUMERIC_AXES", "OOM_DETAIL_FIELDS", "OPTIMIZERS", "OUTCOMES", "PARENT_PHASES", "PEAK_CATEGORIES",
    "PEAK_COUNTERS", "PEAK_SPLIT_FIELDS", "PHASE_COUNTERS", "PHASE_FIELDS", "PRECISIONS", "RECORD_FIELDS",
    "RECORD_FILE", "RESULT_FIELDS", "RESULT_FILE", "RUN_EXIT", "RUN_FILES", "SCHEMA_VERSION", "SEARCH_LOG",
    "SIZE_FIELDS", "SIZE_UNITS", "SOURCES", "SPEC_FILE", "STDERR_FILE", "STDOUT_FILE", "STEP_SUB_PHASES",
    "SUB_PHASE_FIELDS", "TRAIN_PHASES", "WARM_PHASES", "WORKER_OUTCOMES", "WORKLOADS", "WORKLOAD_PARAMS", "Field",
    "GiB", "NewerSchemaError", "RecordError", "Run", "RunSpec", "SpecError", "bytes_text", "classify_run",
    "device_kind_of", "field_names", "find_run_dirs", "gib", "hf_config_kind", "meminfo_bytes", "needs_dynamo",
    "parse_size", "peak_counters", "phase_peak", "proc_kb_field", "read_file", "read_json", "read_run", "read_spec",
    "record_phases", "run_peak", "sub_phase_names", "try_read", "validate_device", "validate_estimate",
    "validate_workload", "write_json_atomic",
]
