"""memsweep's calculators: memory calculated from a description of a load, before anything runs.

Standard library and ``memsweep.conf.contract`` only (no torch, Hydra or pandas): the sweeper
puts a run's estimate into its spec, ``memsweep estimate`` (``estimate.cli``) runs without
PyTorch, and the analysis reads the same figures. Every figure is an integer number of bytes.

An estimate is a ``Breakdown`` (``breakdown``): weights, gradients, optimizer_states,
activations, kv_cache, temporaries (bytes, or ``None`` when not estimated), a planning
``reserve`` and the totals. One module per topic, each citing the source of its formulas;
``fit`` (least squares and root finding), ``cards`` (accelerator memory) and ``labels`` (the
one-line name of a load) are the other calculators the sweeper and the analysis share.

This ``__init__`` re-exports the public names of the estimator's modules, so
``from memsweep.estimator import X`` works for all of them.
"""

from __future__ import annotations

from .activations import (
    RECOMPUTE,
    ActivationSettings,
    korthikanti_layer_bytes,
    run_activations,
    transformer_layer_activation_bytes,
)
from .bnb import BNB_8BIT_BLOCK, BNB_8BIT_BLOCK_BEFORE_0_44, BNB_MIN_8BIT_SIZE, BnbSettings, bnb_settings
from .breakdown import COMPONENT_LABELS, COMPONENTS, ESTIMATE_COLUMNS, Breakdown, estimate_columns
from .counted import COUNTERS, CountUnavailable, count_with_transformers, describe_config, model_from_count
from .formats import (
    DOUBLE_QUANT_BLOCK,
    DTYPE_BYTES,
    DTYPE_FORMATS,
    FORMATS,
    StorageFormat,
    compact_format,
    dtype_bytes,
    storage_format,
    weight_bytes,
    weights_from_shapes,
)
from .hf_config import PARSER_MODEL_TYPES, UnknownConfig, load_hf_config, parse_hf_config, refused_keys
from .kv_cache import KV_CONVENTIONS, cached_tokens, kv_cache_bytes, layer_cached_tokens, resolve_head_dim
from .lora import (
    ALL_LINEAR,
    PEFT_DEFAULT_TARGETS,
    LoraSettings,
    adapter_activation_bytes,
    estimate_lora,
    lora_parameters,
    lora_targets,
)
from .parallel import MODEL_STATE_COMPONENTS, PARALLEL_ZERO_STAGE, estimated_model_states, rank_estimate
from .runs import USER_REASON, estimate_lm_run, estimate_run, transformer_workload_model
from .training import (
    ADAM_STEP_BYTES,
    OPTIMIZERS,
    gradient_bytes,
    master_weight_bytes,
    optimizer_state_bytes,
    training_state,
    zero_partition,
)
from .transformer import (
    LinearModule,
    ParamTensor,
    TransformerConfig,
    estimate_transformer,
    kv_cache_estimate,
    training_activations,
)
from .workloads import (
    ACTIVATION_SAVES_OUTPUT,
    PhaseEstimate,
    estimate_for_spec,
    estimate_mlp,
    mlp_param_shapes,
    mlp_phases,
    mlp_phases_for_spec,
    run_peak,
)

__all__ = [
    # breakdown
    "COMPONENTS",
    "COMPONENT_LABELS",
    "Breakdown",
    "ESTIMATE_COLUMNS",
    "estimate_columns",
    # formats
    "DTYPE_BYTES",
    "DTYPE_FORMATS",
    "dtype_bytes",
    "StorageFormat",
    "DOUBLE_QUANT_BLOCK",
    "FORMATS",
    "storage_format",
    "compact_format",
    "weight_bytes",
    "weights_from_shapes",
    # training
    "OPTIMIZERS",
    # bnb
    "BNB_8BIT_BLOCK",
    "BNB_8BIT_BLOCK_BEFORE_0_44",
    "BNB_MIN_8BIT_SIZE",
    "BnbSettings",
    "bnb_settings",
    "gradient_bytes",
    "master_weight_bytes",
    "optimizer_state_bytes",
    "ADAM_STEP_BYTES",
    "training_state",
    "zero_partition",
    # activations
    "RECOMPUTE",
    "ActivationSettings",
    "run_activations",
    "korthikanti_layer_bytes",
    "transformer_layer_activation_bytes",
    # kv_cache
    "resolve_head_dim",
    "KV_CONVENTIONS",
    "layer_cached_tokens",
    "cached_tokens",
    "kv_cache_bytes",
    # transformer
    "ParamTensor",
    "TransformerConfig",
    "estimate_transformer",
    "LinearModule",
    "training_activations",
    "kv_cache_estimate",
    # lora
    "ALL_LINEAR",
    "PEFT_DEFAULT_TARGETS",
    "LoraSettings",
    "lora_targets",
    "lora_parameters",
    "adapter_activation_bytes",
    "estimate_lora",
    # hf_config (the formula parser)
    "PARSER_MODEL_TYPES",
    "UnknownConfig",
    "refused_keys",
    "parse_hf_config",
    "load_hf_config",
    # counted (transformers' own count, in a worker process)
    "COUNTERS",
    "CountUnavailable",
    "count_with_transformers",
    "model_from_count",
    "describe_config",
    # workloads
    "PhaseEstimate",
    "mlp_param_shapes",
    "ACTIVATION_SAVES_OUTPUT",
    "mlp_phases",
    "mlp_phases_for_spec",
    "run_peak",
    "estimate_mlp",
    "estimate_for_spec",
    # parallel (DDP/FSDP runs)
    "PARALLEL_ZERO_STAGE",
    "MODEL_STATE_COMPONENTS",
    "estimated_model_states",
    "rank_estimate",
    # runs
    "USER_REASON",
    "transformer_workload_model",
    "estimate_lm_run",
    "estimate_run",
]
