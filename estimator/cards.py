"""A small catalog of common accelerator cards and their memory, in bytes, with sources.

A vendor's "16 GB", "24 GB", "40 GB", "80 GB" name binary sizes (16 GiB ... of DRAM, 1 GiB =
2^30 B); the H200's "141 GB" and the MI300X's "192 GB" are marketing figures. ``reported_bytes``
is the total the vendor's management tool reports (``nvidia-smi`` ``memory.total`` in MiB x
2^20; ``rocm-smi`` "VRAM Total Memory (B)"), from the public logs cited per card; with ECC on
GDDR cards (T4) the driver keeps 6.25 % for the ECC bits (NVIDIA CUDA C Best Practices
Guide). PyTorch's ``torch.cuda.get_device_properties(i).total_memory`` is smaller still, and
the CUDA context lies outside ``memory_reserved``.

So ``reported_bytes`` is an upper bound of what a PyTorch process can reserve on the card; a
check against it is a calculation, never a measurement on that card.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20
GiB = 2**30


@dataclass(frozen=True)
class Card:
    """One card. ``reported_bytes``: the total memory its management tool reports (bytes)."""

    name: str
    vendor_spec: str  # the vendor's own words, e.g. "16 GB GDDR6"
    vendor_unit: str  # what the vendor's "GB" stands for on this card
    reported_bytes: int
    reported_by: str  # the tool and the figure it printed
    source: str  # where that figure was seen
    note: str = ""


_CATALOG: tuple[Card, ...] = (
    Card(
        "NVIDIA T4",
        "16 GB GDDR6",
        "16 GiB physical; ECC (on by default) keeps 6.25 %",
        15360 * MiB,
        "nvidia-smi memory.total = 15360 MiB (ECC on)",
        "modal-labs/modal-client PR #2797 (nvidia-smi totals of its GPU types); "
        "NVIDIA forum 'NVIDIA T4 has only 15g of memory?' (ECC, Best Practices Guide)",
        "torch total_memory seen as 15843721216 B (deviceQuery)",
    ),
    Card(
        "NVIDIA A10G",
        "24 GB GDDR6",
        "24 GiB physical, less the driver's reservation",
        23028 * MiB,
        "nvidia-smi memory.total = 23028 MiB (A10; A10G assumed equal)",
        "modal-labs/modal-client PR #2797 lists the A10; the A10G (AWS g5) has the same 24 GB GDDR6 configuration",
        "assumed equal to the A10's figure, not seen for the A10G itself",
    ),
    Card(
        "NVIDIA L4",
        "24 GB GDDR6",
        "24 GiB physical, less the driver's reservation",
        23034 * MiB,
        "nvidia-smi memory.total = 23034 MiB",
        "modal-labs/modal-client PR #2797",
    ),
    Card(
        "NVIDIA RTX 3090",
        "24 GB GDDR6X",
        "24 GiB physical (no ECC)",
        24576 * MiB,
        "nvidia-smi memory.total = 24576 MiB",
        "github.com/noonghunna/club-3090/issues/1129 (nvidia-smi output)",
    ),
    Card(
        "NVIDIA RTX 4090",
        "24 GB GDDR6X",
        "24 GiB physical, less the driver's reservation",
        24564 * MiB,
        "nvidia-smi memory.total = 24564 MiB",
        "github.com/RLinf/RLinf/issues/255 (nvidia-smi output)",
    ),
    Card(
        "NVIDIA A100 40GB",
        "40 GB HBM2",
        "40 GiB",
        40960 * MiB,
        "nvidia-smi memory.total = 40960 MiB",
        "modal-labs/modal-client PR #2797",
        "torch total_memory seen as 42298834944 B (deviceQuery, A100-SXM4-40GB)",
    ),
    Card(
        "NVIDIA A100 80GB",
        "80 GB HBM2e",
        "80 GiB",
        81920 * MiB,
        "nvidia-smi memory.total = 81920 MiB = 85899345920 B",
        "modal-labs/modal-client PR #2797",
    ),
    Card(
        "NVIDIA H100 80GB",
        "80 GB HBM3",
        "80 GiB physical, less the driver's reservation",
        81559 * MiB,
        "nvidia-smi memory.total = 81559 MiB (H100 SXM)",
        "modal-labs/modal-client PR #2797",
    ),
    Card(
        "NVIDIA H200",
        "141 GB HBM3e",
        "141 is a marketing figure; the driver reports 140.4 GiB",
        143771 * MiB,
        "nvidia-smi memory.total = 143771 MiB (seen on an H200 NVL)",
        "a public H200 NVL run log quoting nvidia-smi; the SXM part is assumed equal",
    ),
    Card(
        "AMD MI300X",
        "192 GB HBM3",
        "192 GiB physical; rocm-smi reports 191.98 GiB",
        206141652992,
        "rocm-smi VRAM Total Memory (B) = 206141652992",
        "ROCm issue 'rocm-smi shows inconsistent VRAM for partitioned MI300A and MI300X' (unpartitioned figure)",
        "a ROCm build of PyTorch reuses torch.cuda for this card",
    ),
)
CARDS: tuple[Card, ...] = tuple(sorted(_CATALOG, key=lambda c: c.reported_bytes))
"""The catalog, smallest first. Every byte count is the card's reported total (see module
docstring); none of these cards was measured by memsweep."""


def holds(card: Card, need_bytes: int, margin_bytes: int) -> bool:
    """True when ``need_bytes`` plus ``margin_bytes`` fit in the card's reported total."""
    return need_bytes + margin_bytes <= card.reported_bytes
