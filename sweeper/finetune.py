"""Host checks of the fine-tuning and compile options, before any worker starts.

What ``conf.contract.finetune`` cannot check from the spec alone: that ``workload.pretrained`` is
a directory holding a checkpoint (config.json and safetensors files, what ``save_pretrained``
writes), that the optional packages are installed (peft for LoRA, bitsandbytes for a 4-bit
base; found with ``importlib.util.find_spec``, nothing imported) and that torch.compile's
Inductor backend can run on the device (a C++ compiler on the CPU: ``$CXX`` or ``g++``, the one
torch/_inductor/cpp_builder.py calls; Triton on CUDA). Each refusal is a ``SpecError`` naming
the field. This process never imports torch.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
from pathlib import Path

from memsweep.conf.contract import RunSpec, SpecError


def check_pretrained(directory: str) -> str:
    """Check a checkpoint directory and return its absolute path (the worker runs elsewhere).

    Args:
        directory: the hf workload's ``pretrained``.

    Returns:
        The absolute path.

    Raises:
        SpecError: (``workload.pretrained``) not a directory, or without config.json or any
            ``*.safetensors`` file.
    """
    path = Path(directory).expanduser().resolve()
    if not path.is_dir():
        raise SpecError("workload.pretrained", directory, "an existing local directory written by save_pretrained")
    if not (path / "config.json").is_file():
        raise SpecError("workload.pretrained", directory, "a directory holding config.json (save_pretrained writes it)")
    if not any(path.glob("*.safetensors")):
        raise SpecError(
            "workload.pretrained",
            directory,
            "a directory holding *.safetensors weights (save_pretrained's default; .bin files are not loaded)",
        )
    return str(path)


def compile_refusal(device: str) -> str | None:
    """Why ``torch.compile`` cannot run on ``device`` here (no C++ compiler on the CPU, no Triton
    on CUDA), or None."""
    if device.startswith("cpu"):
        cxx = os.environ.get("CXX") or "g++"
        if shutil.which(cxx) is None:
            return (
                f"false on this host: torch.compile on the CPU needs a C++ compiler ({cxx!r}, or set CXX), none found"
            )
        return None
    if importlib.util.find_spec("triton") is None:
        return "false on this host: torch.compile on a CUDA device needs Triton (pip install triton)"
    return None


def check_host_options(spec: RunSpec) -> RunSpec:
    """Refuse, before any worker starts, fine-tuning or compile options this host cannot run.

    Args:
        spec: a validated spec.

    Returns:
        ``spec``, with ``workload.pretrained`` made absolute.

    Raises:
        SpecError: naming the field (``workload.pretrained``, ``workload.lora_rank``,
            ``workload.quantization``, ``compile``).
    """
    if spec.compile != "false":
        why = compile_refusal(spec.device)
        if why:
            raise SpecError("compile", spec.compile, why)
    if spec.workload_name != "hf":
        return spec
    w = spec.workload
    if w["lora_rank"] is not None and importlib.util.find_spec("peft") is None:
        raise SpecError("workload.lora_rank", w["lora_rank"], "null, or install peft: pip install 'memsweep[lora]'")
    if w["quantization"] is not None and importlib.util.find_spec("bitsandbytes") is None:
        raise SpecError(
            "workload.quantization", w["quantization"], "null, or install bitsandbytes: pip install 'memsweep[lora]'"
        )
    if w["pretrained"] is None:
        return spec
    workload = {**w, "pretrained": check_pretrained(w["pretrained"])}
    return dataclasses.replace(spec, workload=workload)
