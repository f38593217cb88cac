"""The estimator: memory calculated from a description of the load, before anything runs.

Standard library only (no torch, no pandas): the sweeper imports it to put the estimate of
a run into its spec, and ``memsweep estimate`` (``analysis/estimate/cli.py``) runs it
without PyTorch installed.

Every figure is an integer number of **bytes**. Conversion happens only when printing,
once, in separate columns: 1 GB = 10**9 B, 1 GiB = 2**30 B (NIST binary prefixes).

What this package calculates, module by module, and from which source:

* ``formats``: weights by storage format (fp32, fp16/bf16, int8, 4-bit NF4/FP4 with
  per-block scales, QLoRA double quantization, modules kept in another precision):
  bitsandbytes docs, Dettmers et al. 2022 (LLM.int8(); 8-bit optimizers via block-wise
  quantization), Dettmers et al. 2023 (QLoRA);
* ``bnb``: bitsandbytes' 8-bit optimizer block and ``min_8bit_size``, from the installed
  package (read without importing it) or its current defaults;
* ``training``: gradients, the fp32 master copy of mixed precision, optimizer states
  (AdamW, 8-bit AdamW, SGD with/without momentum, Adafactor) and ZeRO stages 1/2/3 over
  N devices: Rajbhandari et al. 2020 (ZeRO), Loshchilov & Hutter 2019 (AdamW), Shazeer &
  Stern 2018 (Adafactor), PyTorch torch.optim docs;
* ``activations``: a decoder-only transformer's activations by Korthikanti et al. 2022
  (``transformer_layer_activation_bytes``);
* ``kv_cache``: 2 x layers x kv_heads x head_dim x tokens x bytes x sequences (Hugging
  Face transformers docs, "KV cache strategies");
* ``transformer``: a described decoder (dense or mixture of experts) and its whole estimate
  (``estimate_transformer``);
* ``lora``: LoRA / QLoRA fine-tuning: adapters of r x (in + out) parameters on the chosen
  Linear modules (peft's defaults per architecture), their gradients and optimizer states, the
  frozen base in its storage format: Hu et al. 2021 (LoRA), Dettmers et al. 2023 (QLoRA),
  peft's source;
* ``counted``: a local ``config.json`` counted by transformers itself, the model built on the
  meta device in a worker process (``describe_config``; never downloads);
* ``hf_config``: the formula parser, the fallback without transformers, which refuses the
  config keys it does not model (``load_hf_config``);
* ``workloads``: memsweep's built-in ``mlp`` workload, exactly (an allocation-by-allocation
  replay of the PyTorch ops of ``worker/workloads/mlp.py``, see ``mlp_phases``), and the
  estimate the sweeper puts into a RunSpec (``estimate_for_spec``);
* ``parallel``: a DDP/FSDP run's estimate per rank (``rank_estimate``) and its model states
  (``estimated_model_states``), the whole replica's partitioned at ZeRO stage 0 (ddp) or 3
  (fsdp) over its ranks;
* ``runs``: the estimate of a run of any workload, or the reason there is none
  (``estimate_run``: mlp exactly, transformer and hf by the formulas, user not described);
* ``breakdown``: the result every module returns, and its runs.parquet columns.

Every estimate is a ``Breakdown``: weights, gradients, optimizer_states, activations,
kv_cache, temporaries (each bytes, or ``None`` when it was not estimated, never a silent
0), a planning ``reserve`` and the totals. What was calculated here stays apart from what
the worker observed (the counters) and from what is assumed (the reserve).

This ``__init__`` re-exports the public names of every module, so ``from analysis.estimate
import X`` and ``analysis.estimate.X`` work for all of them.
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
