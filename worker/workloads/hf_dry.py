"""Dry runs of the ``hf`` workload: make ``transformers`` take, on fake tensors, the branches it
takes on memsweep's real inputs, or refuse.

``transformers`` treats a fake tensor as a traced one (``transformers.utils.import_utils.is_tracing``
is True for ``torch._subclasses.FakeTensor``) and then skips the checks that read tensor values,
taking the branch a compiler needs: for instance a full boolean causal mask passed to
``scaled_dot_product_attention`` instead of ``is_causal=True``, which changes the kernel and the
bytes it saves for backward. The real run of the same spec reads the values and takes the other
branch. Where memsweep knows the answer from its own inputs, the dry run gives it:

* ``masking_utils.find_packed_sequence_indices``: memsweep passes no ``position_ids``; the model's
  own are one ``arange`` per row (one sequence per row, not packed), for which the real function
  returns None. Answered None for fake position ids.
* ``masking_utils._ignore_causal_mask_sdpa`` with a tensor ``q_offset`` (a StaticCache): memsweep
  decodes one token at a time (``q_length == 1``) and prefills on an empty cache
  (``q_offset == 0``), with no padding mask; a fake ``q_offset`` is read as 0, which gives the
  real answer in both cases (transformers 5.x, ``masking_utils.py``).

Any other place of ``masking_utils`` or of the model's own module that asks ``is_tracing`` about a
fake tensor ends the dry run with ``TracingBranch`` (a ``DryRunUnsupported`` outcome naming that
function and the module being run), never a number from a branch the real run does not take.
``modeling_utils.PreTrainedModel.warn_if_padding_and_no_attention_mask`` is left as it is: its
tracing branch only skips a warning.

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
