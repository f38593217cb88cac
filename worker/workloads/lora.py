"""LoRA adapters through peft on an hf model (workload ``lora_rank`` ...), and QLoRA's preparation
of a 4-bit base.

``peft.get_peft_model`` freezes every base parameter and adds, to each targeted ``nn.Linear``
(in -> out), ``lora_A`` (r x in) and ``lora_B`` (out x r): r * (in + out) trainable parameters
per adapted Linear (Hu et al. 2021, arXiv:2106.09685, Sec. 4.1). With a 4-bit base (QLoRA,
Dettmers et al. 2023, arXiv:2305.14314) ``peft.prepare_model_for_kbit_training`` runs first: it
freezes the base and upcasts the parameters that are not quantized to float32.

Sources: https://huggingface.co/docs/peft/package_reference/lora (``LoraConfig``),
https://huggingface.co/docs/peft/package_reference/peft_model (``get_nb_trainable_parameters``),
https://huggingface.co/docs/peft/developer_guides/quantization (k-bit training).
peft is optional: imported here, inside the worker, only for a spec with ``lora_rank``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .errors import DependencyMissing


def import_peft() -> Any:
    """Import peft (optional: only for LoRA).

    Returns:
        The peft module.

    Raises:
        DependencyMissing: peft is not installed (the message names the extra to install).
    """
    try:
        import peft  # optional: imported only for workload.lora_rank
    except ImportError as exc:
        raise DependencyMissing(
            f"workload.lora_rank needs the peft package, which is not installed ({exc}): pip install 'memsweep[lora]'"
        ) from None
    return peft


def lora_config(peft: Any, workload: dict) -> Any:
    """peft's ``LoraConfig`` of the workload's settings (task CAUSAL_LM).

    Args:
        peft: the peft module.
        workload: the hf workload's validated settings (``lora_rank``, ``lora_alpha``: null =
            peft's default, ``lora_dropout``, ``lora_targets``: null = peft's default for the
            architecture, ``all-linear`` or a list of module names).

    Returns:
        A ``peft.LoraConfig``.
    """
    kwargs: dict[str, Any] = {"r": workload["lora_rank"], "lora_dropout": float(workload["lora_dropout"])}
    if workload["lora_alpha"] is not None:
        kwargs["lora_alpha"] = workload["lora_alpha"]
    if workload["lora_targets"] is not None:
        kwargs["target_modules"] = workload["lora_targets"]
    return peft.LoraConfig(task_type="CAUSAL_LM", **kwargs)


def apply_lora(model: nn.Module, workload: dict, quantized: bool) -> nn.Module:
    """Wrap ``model`` with LoRA adapters (peft.get_peft_model); the base is frozen.

    Args:
        model: the hf causal LM, on its device.
        workload: the hf workload's validated settings.
        quantized: the base was loaded in 4 bits (QLoRA): ``prepare_model_for_kbit_training``
            first (gradient checkpointing is left to the spec's ``checkpointing``).

    Returns:
        The ``PeftModel``.

    Raises:
        DependencyMissing: peft is not installed.
        ValueError: (from peft) no module matches the targets.
    """
    peft = import_peft()
    if quantized:
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return peft.get_peft_model(model, lora_config(peft, workload))


def lora_info(model: Any) -> dict:
    """What the record says of the adapters: settings, adapted modules and peft's own counts.

    Args:
        model: a ``PeftModel`` (``apply_lora``).

    Returns:
        ``rank``, ``alpha``, ``dropout``, ``targets`` (the module names peft resolved, sorted),
        ``adapted_modules`` (how many Linear layers carry an adapter), ``adapter_shapes`` (per
        adapted module kind: ``in``, ``out``, ``count``), ``peft_trainable_parameters`` and
        ``peft_all_parameters`` (``get_nb_trainable_parameters``: peft counts a 4-bit weight's
        packed bytes as 2 values each), ``peft`` (its version).
    """
    import peft

    config = model.peft_config["default"]
    trainable, total = model.get_nb_trainable_parameters()
    shapes: dict[str, dict] = {}
    adapted = 0
    for name, module in model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if not isinstance(lora_a, nn.ModuleDict) or "default" not in lora_a:
            continue
        adapted += 1
        kind = name.rsplit(".", 1)[-1]
        entry = shapes.setdefault(kind, {"in": module.in_features, "out": module.out_features, "count": 0})
        entry["count"] += 1
    targets = config.target_modules
    return {
        "rank": config.r,
        "alpha": config.lora_alpha,
        "dropout": config.lora_dropout,
        "targets": sorted(targets) if isinstance(targets, (set, list, tuple)) else targets,
        "adapted_modules": adapted,
        "adapter_shapes": shapes,
        "peft_trainable_parameters": int(trainable),
        "peft_all_parameters": int(total),
        "peft": peft.__version__,
    }
