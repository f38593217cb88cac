"""Dry runs of the ``hf`` workload: make ``transformers`` take, on fake tensors, the branches it
takes on memsweep's real inputs, or refuse.

``transformers`` treats a fake tensor as a traced one (``is_tracing``) and takes the branch a
compiler needs (a full boolean causal mask instead of ``is_causal=True``, for instance), which
changes the kernel and the bytes it saves. Where memsweep knows the answer from its own inputs
the dry run gives it: ``masking_utils.find_packed_sequence_indices`` is None (one sequence per
row), and a fake ``q_offset`` of ``_ignore_causal_mask_sdpa`` is read as 0 (prefill on an empty
cache, decode one token). Any other ``is_tracing`` question about a fake tensor ends the dry run
with ``TracingBranch`` (a ``DryRunUnsupported`` outcome naming the function and module), never a
number from a branch the real run does not take.

Only dry-run worker processes call ``install`` (a dry run is a throwaway process).
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType

import torch

# Functions whose tracing branch changes nothing the dry run counts (a warning skipped).
HARMLESS_TRACING_SITES = frozenset({"warn_if_padding_and_no_attention_mask"})


class TracingBranch(RuntimeError):
    """transformers asked whether a fake tensor is being traced at a place whose real answer
    memsweep does not know: the dry run cannot follow the real run there.

    Attributes:
        func: ``module.function`` of transformers that asked (str), named in the message.
    """

    dry_run_unsupported = True  # worker.counters.dry_run_unsupported: a DryRunUnsupported outcome

    def __init__(self, func: str) -> None:
        self.func = func
        super().__init__(
            f"transformers {func} reads tensor values that a fake tensor does not have (it takes its "
            f"tracing branch on fake tensors, which the real run does not take)"
        )


def _is_fake(x) -> bool:
    return isinstance(x, torch._subclasses.FakeTensor)


def _watch(module: ModuleType) -> None:
    """Replace ``module.is_tracing`` by one that raises ``TracingBranch`` when the only reason
    to answer True is a fake tensor (and the caller is not in HARMLESS_TRACING_SITES)."""
    original = getattr(module, "is_tracing", None)
    if original is None or getattr(original, "_memsweep_watch", False):
        return

    @functools.wraps(original)
    def is_tracing(tensor=None) -> bool:
        if tensor is not None and _is_fake(tensor) and not original(None):
            caller = sys._getframe(1).f_code.co_name
            if caller not in HARMLESS_TRACING_SITES:
                raise TracingBranch(f"{module.__name__}.{caller}")
        return original(tensor)

    is_tracing._memsweep_watch = True  # type: ignore[attr-defined]  # a monkeypatch of transformers
    module.is_tracing = is_tracing  # type: ignore[attr-defined]  # a monkeypatch of transformers


def install(transformers: ModuleType, model: torch.nn.Module | None = None) -> list[str]:
    """Give transformers the answers of memsweep's real inputs (module docstring) and watch the
    other places that would take a tracing branch on fake tensors.

    Args:
        transformers: the imported ``transformers`` package.
        model: the built model (its own module is watched too), or None before model_load.

    Returns:
        The names of what was answered or watched (for the record), e.g.
        ``["masking_utils.find_packed_sequence_indices", "watch:transformers.masking_utils"]``.
    """
    done = []
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None:
        try:
            from transformers import masking_utils as masking  # optional: hf dry runs only
        except ImportError:
            masking = None
    if masking is not None:
        packed = getattr(masking, "find_packed_sequence_indices", None)
        if packed is not None and not getattr(packed, "_memsweep_answer", False):

            @functools.wraps(packed)
            def find_packed_sequence_indices(position_ids):
                if _is_fake(position_ids):
                    return None  # one arange per row: not packed (the real function's answer)
                return packed(position_ids)

            find_packed_sequence_indices._memsweep_answer = True  # type: ignore[attr-defined]  # a monkeypatch of transformers
            masking.find_packed_sequence_indices = find_packed_sequence_indices  # type: ignore[attr-defined]  # a monkeypatch of transformers
            done.append("masking_utils.find_packed_sequence_indices")
        skip = getattr(masking, "_ignore_causal_mask_sdpa", None)
        if skip is not None and not getattr(skip, "_memsweep_answer", False):

            @functools.wraps(skip)
            def _ignore_causal_mask_sdpa(padding_mask, q_length, kv_length, q_offset, kv_offset, *args, **kwargs):
                if _is_fake(q_offset):
                    q_offset = 0  # prefill on an empty cache; decode has q_length 1 (either answer)
                return skip(padding_mask, q_length, kv_length, q_offset, kv_offset, *args, **kwargs)

            _ignore_causal_mask_sdpa._memsweep_answer = True  # type: ignore[attr-defined]  # a monkeypatch of transformers
            masking._ignore_causal_mask_sdpa = _ignore_causal_mask_sdpa  # type: ignore[attr-defined]  # a monkeypatch of transformers
            done.append("masking_utils._ignore_causal_mask_sdpa")
        _watch(masking)
        done.append("watch:" + masking.__name__)
    modules = [sys.modules.get("transformers.modeling_utils")]
    if model is not None:
        modules += [sys.modules.get(type(m).__module__) for m in model.modules()]
    for module in dict.fromkeys(m for m in modules if m is not None and hasattr(m, "is_tracing")):
        _watch(module)
        done.append("watch:" + module.__name__)
    return done
