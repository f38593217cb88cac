"""``memsweep predict [OVERRIDES] --cards [NAMES]``: the predicted edge of one load on every card.

One load, the cards of ``estimator.cards.CARDS`` (or those named), one search of the axis per
card on dry runs (``sweeper.predict.Predictor``), smallest card first. The cards share one
directory of dry runs and their results (``Predictor``'s ``finished``): a value already run for
a smaller card is judged against the next card's capacity, never run nor read again, and each
search starts at the previous card's edge. The capacity of a card is its reported total
(``Card.reported_bytes``: what its management tool reports, an upper bound of what a PyTorch
process can use there; see estimator/cards.py). Beside each prediction, the estimator's figures (calculated,
``estimator.hf_load``, hf loads): weights + gradients + optimizer states, and in train
mode along ``batch`` the estimator's own edge (Korthikanti et al. 2022 activations).

Writes ``predict_cards.json`` beside the dry runs. A prediction of tensor bytes: its blind
spots (``sweeper.predict.blind_spots``) are in the summary and printed with the table.
"""

from __future__ import annotations

from memsweep.conf.contract import SpecError, write_json_atomic
from memsweep.estimator.cards import CARDS, Card

from .callbacks import report_card
from .predict import PredictedEdge, Predictor, blind_spots, compose_load
from .predict_parts import estimator_figures, hf_config
from .search import check_search_axis


def select_cards(names: list[str] | None) -> list[Card]:
    """The cards of the catalog named by ``names`` (case-insensitive, a card matches when every
    word of the name is in its name: ``a100 80``), smallest first; all of them for None or [].

    Raises:
        SpecError: a name no card matches (field ``--cards``), listing the catalog.
    """
    if not names:
        return list(CARDS)
    chosen = []
    for name in names:
        words = name.lower().split()
        found = [c for c in CARDS if all(w in c.name.lower() for w in words)]
        if not found:
            raise SpecError("--cards", name, "a card of the catalog: " + ", ".join(c.name for c in CARDS))
        chosen += [c for c in found if c not in chosen]
    return sorted(chosen, key=lambda c: c.reported_bytes)


CARD_TABLE_HEAD = (
    f"  {'card':<18} {'capacity GiB':>12} {'max fit':>8} {'min miss':>8} {'peak GiB':>9}"
    f" | {'estimator: w+g+s GiB':>20} {'estimator edge':>14}"
)
"""The head of ``memsweep predict --cards``'s table, above the ``card_table_row`` lines."""


def card_table_row(row: dict) -> str:
    """One card's line of ``memsweep predict --cards``'s table, aligned under ``CARD_TABLE_HEAD``.

    A missing figure (no min miss, peak or estimator figure: a failed dry run, a workload the
    estimator does not describe) is ``-``; no value that fits is ``none``, and so is an estimator
    edge of 0 (batch 1 does not fit); ``?`` marks a max fit that is not exact.

    Args:
        row: one of ``predict_cards``'s ``"cards"`` rows (bytes as int).

    Returns:
        The line, capacities and peaks in GiB (2^30 B), two decimals.
    """
    gib = 2**30
    fit = "none" if row["max_fit"] is None else str(row["max_fit"]) + ("" if row["exact"] else "?")
    miss = "-" if row["min_miss"] is None else str(row["min_miss"])
    peak = "-" if row["peak_bytes"] is None else f"{row['peak_bytes'] / gib:.2f}"
    fixed = "-" if row["estimator_fixed_bytes"] is None else f"{row['estimator_fixed_bytes'] / gib:.2f}"
    est_edge = {None: "-", 0: "none"}.get(row["estimator_edge"], str(row["estimator_edge"]))
    line = f"  {row['card']:<18} {row['capacity_bytes'] / gib:>12.2f} {fit:>8} {miss:>8} {peak:>9}"
    return line + f" | {fixed:>20} {est_edge:>14}"


def _estimator_edge(base, record: dict | None, capacity: int) -> int | None:
    """The estimator's batch edge of a train load on ``capacity`` bytes: 0 when batch 1 does
    not fit; None when not asked (another mode or workload, no config in the record)."""
    from memsweep.estimator.hf_load import estimate_hf_batch_edge

    config = hf_config(base, record)
    if base.mode != "train" or config is None:
        return None
    try:
        edge = estimate_hf_batch_edge(config, base, capacity)
    except ValueError:
        return None
    return 0 if edge is None else edge


def card_row(
    card: Card, predictor: Predictor, edge: PredictedEdge, fixed: int | None, estimator_edge: int | None
) -> dict:
    """One card's row of predict_cards.json.

    Args:
        card: the card.
        predictor: its dry runs.
        edge: ``Predictor.search``'s answer on the card's capacity.
        fixed: the estimator's weights + gradients + optimizer states (bytes), or None.
        estimator_edge: the estimator's batch edge (``_estimator_edge``), or None.

    Returns:
        The row (``predict_cards``'s ``"cards"``).
    """
    at = predictor.runs.get(edge.max_fit) if edge.max_fit is not None else None
    return {
        "card": card.name,
        "capacity_bytes": card.reported_bytes,
        "max_fit": edge.max_fit,
        "min_miss": edge.min_miss,
        "exact": edge.exact,
        "peak_bytes": at["peak"] if at else None,
        "error": edge.error["error_message"] if edge.error else None,
        "estimator_fixed_bytes": fixed,
        "estimator_edge": estimator_edge,
    }


def predict_cards(
    overrides: list[str], axis: str, names: list[str] | None = None, axis_field: str = "axis", upper: int | None = None
) -> dict:
    """Predict the edge of ``axis`` for one load on each card; write predict_cards.json.

    Args:
        overrides: the load's overrides (those of ``memsweep run``); no capacity (each card's).
        axis: batch, context or width.
        names: card names (``select_cards``), or None for the whole catalog.
        axis_field: how the user named the axis (``--axis``), named when it is refused.
        upper: the largest value searched (``--upper``); None: the frontier sweeper's default
            (``Predictor``).

    Returns:
        {"axis", "source": "predicted", "device", "out_dir", "dry_runs", "blind_spots", "load"
        (the load's spec as a dict), "cards": one row per card: "card", "capacity_bytes", "max_fit",
        "min_miss", "exact",
        "peak_bytes" (the largest predicted phase peak at max_fit), "error" (a failed dry run's
        message, or None), "estimator_fixed_bytes" (weights + gradients + optimizer states,
        calculated; None for a workload the estimator does not describe) and
        "estimator_edge" (train along batch, 0 when batch 1 does not fit; else None)}.

    Raises:
        SpecError: an unknown axis or card, an axis the load ignores, bad input in the load, a
            load the dry run refuses.
    """
    check_search_axis(axis, axis_field)
    cards = select_cards(names)
    base, isolation, out_dir = compose_load(overrides, axis, axis_field)
    start, rows, record, fixed = getattr(base, axis), [], None, None
    finished: dict = {}  # the dry runs of every card: each value executed once
    device = base.device
    for i, card in enumerate(cards, 1):
        predictor = Predictor(base, axis, card.reported_bytes, out_dir, isolation, finished=finished, upper=upper)
        edge = predictor.search(start)
        device = predictor.device
        if record is None:  # the load's first record, and the estimator's figures of it (once)
            record = next((r["record"] for r in predictor.runs.values() if r["record"]), None)
            est = estimator_figures(base, record)
            if est is not None:
                fixed = sum(est[k] or 0 for k in ("weights", "gradients", "optimizer_states"))
        estimator_edge = _estimator_edge(base, record, card.reported_bytes) if axis == "batch" else None
        rows.append(card_row(card, predictor, edge, fixed, estimator_edge))
        report_card(i, len(cards), rows[-1], axis)
        if edge.max_fit is not None:
            start = edge.max_fit
    summary = {
        "axis": axis,
        "source": "predicted",
        "device": device,
        "out_dir": str(out_dir),
        "dry_runs": len(finished),
        "blind_spots": list(blind_spots(device)),
        "load": base.to_dict(),
        "cards": rows,
    }
    write_json_atomic(out_dir / "predict_cards.json", summary)
    return summary
