"""bitsandbytes' 8-bit optimizer settings: from the installed package, or its current defaults.

Read without importing bitsandbytes (it imports torch, which the estimate never does): the
installed version from its distribution metadata (``importlib.metadata``) and the
``min_8bit_size`` default from the source of ``bitsandbytes/optim/adamw.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import re
from pathlib import Path

from memsweep.conf.contract import version_tuple

BNB_8BIT_BLOCK = 256
"""Values per fp32 absmax of the 8-bit optimizer states in current bitsandbytes (block-wise
quantization, Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization")."""
BNB_8BIT_BLOCK_BEFORE_0_44 = 2048
"""The block of the 8-bit optimizer states in bitsandbytes releases before 0.44."""
BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes keeps the state of tensors with fewer values than this in 32 bits (its 8-bit
optimizers' ``min_8bit_size`` default)."""


@dataclasses.dataclass(frozen=True)
class BnbSettings:
    """The 8-bit optimizer settings an estimate uses, and where they come from.

    Attributes:
        block: values per fp32 absmax scale.
        min_8bit_size: tensors with fewer values keep 32-bit states.
        source: ``"bitsandbytes X.Y installed"`` or ``"bitsandbytes not installed: its
            current defaults"``.
    """

    block: int = BNB_8BIT_BLOCK
    min_8bit_size: int = BNB_MIN_8BIT_SIZE
    source: str = "bitsandbytes not installed: its current defaults"


def bnb_settings() -> BnbSettings:
    """The installed bitsandbytes' 8-bit optimizer block and ``min_8bit_size``, else defaults.

    Returns:
        a BnbSettings; its ``source`` says which.
    """
    try:
        version = importlib.metadata.version("bitsandbytes")
    except importlib.metadata.PackageNotFoundError:
        return BnbSettings()
    block = BNB_8BIT_BLOCK if version_tuple(version) >= (0, 44) else BNB_8BIT_BLOCK_BEFORE_0_44
    min_size = BNB_MIN_8BIT_SIZE
    spec = importlib.util.find_spec("bitsandbytes")
    for location in (spec.submodule_search_locations or []) if spec else []:
        source = Path(location, "optim", "adamw.py")
        match = re.search(r"min_8bit_size\s*=\s*(\d+)", source.read_text()) if source.exists() else None
        if match:
            min_size = int(match.group(1))
            break
    return BnbSettings(block, min_size, f"bitsandbytes {version} installed")
