"""The optional packages some tests need (pyproject.toml's extras), whether they are installed,
and the skip marks that say how to install them, written once."""

import importlib.util

import pytest


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (``importlib.util.find_spec``), without importing it."""
    return importlib.util.find_spec(module) is not None


HAS_TRANSFORMERS = installed("transformers")
"""The hf workload's dependency (extra ``hf``)."""
HAS_PEFT = HAS_TRANSFORMERS and installed("peft")
"""LoRA adapters on the hf workload (extra ``lora``); peft needs transformers."""
HAS_BITSANDBYTES = installed("bitsandbytes")
"""QLoRA's 4-bit base and the 8-bit optimizers (extra ``lora``)."""

needs_transformers = pytest.mark.skipif(
    not HAS_TRANSFORMERS, reason="transformers is not installed: pip install 'memsweep[hf]'"
)
needs_peft = pytest.mark.skipif(
    not HAS_PEFT, reason="transformers and peft are not installed: pip install 'memsweep[hf,lora]'"
)
needs_bnb = pytest.mark.skipif(
    not HAS_BITSANDBYTES, reason="bitsandbytes is not installed: pip install 'memsweep[lora]'"
)
