"""The report's "Model loading" table: the ``model_load`` phase of each run whose load differs in
how its model came to be (a local checkpoint through ``from_pretrained`` beside the same model
built from its config with random weights), and what trains (LoRA), so a reader sees what real
loading costs next to random initialisation.

Observed counters only (``max_memory_allocated`` / ``max_memory_reserved`` of ``model_load``,
bytes, and its wall time); shown when some run loaded a checkpoint, trained adapters or ran
compiled.
"""

from __future__ import annotations

from ..doc import Doc
from .fmt import nbytes, workload_params

MODEL_LOAD = "model_load"


def _source(params: dict) -> str:
    """How the run's model was made: the checkpoint (and its quantization) or a config."""
    if params.get("pretrained"):
        quant = f", {params['quantization']} 4-bit base" if params.get("quantization") else ""
        return f"checkpoint {params['pretrained']} (from_pretrained{quant})"
    return f"config {params.get('config')} (from_config, random weights)" if params.get("config") else "built"


def loading_section(doc: Doc, runs: list[dict], phases: list[dict]) -> None:
    """Append the "Model loading" table, one row per run, when any run loaded a checkpoint,
    trained LoRA adapters or ran under torch.compile; nothing otherwise.

    Args:
        doc: the report.
        runs: rows of the runs table (``workload_params``, ``compile``, ``trainable_parameters``...).
        phases: rows of the phases table (``run_id``, ``phase``, counters in bytes, ``duration_s``).
    """
    params = {r.get("run_id"): workload_params(r) for r in runs}
    if not any(
        p.get("pretrained") or p.get("lora_rank") or (r.get("compile") not in (None, "false"))
        for r, p in zip(runs, params.values())
    ):
        return
    load = {(p.get("sweep_dir"), p.get("run_id")): p for p in phases if p.get("phase") == MODEL_LOAD}
    rows = []
    for r in runs:
        p = params.get(r.get("run_id")) or {}
        phase = load.get((r.get("sweep_dir"), r.get("run_id"))) or {}
        duration = phase.get("duration_s")
        rows.append(
            [
                r.get("run_id"),
                _source(p),
                p.get("lora_rank") if p.get("lora_rank") is not None else "-",
                r.get("compile") or "-",
                r.get("trainable_parameters"),
                r.get("frozen_parameters"),
                nbytes(phase.get("max_memory_allocated")),
                nbytes(phase.get("max_memory_reserved")),
                f"{duration:.2f}" if isinstance(duration, (int, float)) else "-",
            ]
        )
    doc.h(3, "Model loading")
    doc.table(
        [
            "run",
            "model from",
            "LoRA rank",
            "compile",
            "trainable params",
            "frozen params",
            "model_load max allocated",
            "model_load max reserved",
            "model_load s",
        ],
        rows,
        note="Observed: the model_load phase's peaks (bytes). A checkpoint's row measures real loading "
        "(safetensors read, placed on the device, quantized as it arrives); a config's row random initialisation.",
    )
