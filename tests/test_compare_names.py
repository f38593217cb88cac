"""memsweep compare names a load's workload parameters compactly: those that differ between the
loads compared (or a short stable digest when many do), the same in the console and the page,
never their whole JSON. Sweeps made of rows (no worker runs)."""

import importlib
import json
from pathlib import Path

from memsweep.analysis.compare import compare_document, compare_text, match, names, render
from memsweep.analysis.compare.load import Sweep
from memsweep.analysis.doc import to_markdown


def _params(blocks: int, target: str = "mine.build", **more) -> str:
    """A user workload's parameters as runs.parquet holds them (JSON text)."""
    model = {"_target_": target, "blocks": blocks, "classes": 10, **more}
    return json.dumps({"inputs": {"_target_": "mine.inputs"}, "model": model, "path": ["/home/u/project"]})


def _sweep(label: str, params: list[str]) -> Sweep:
    """A batch sweep (1, 2) of a user workload per entry of ``params``, every run ok, one phase."""
    runs, phases = [], []
    for i, p in enumerate(params):
        for v in (1, 2):
            run_id = f"{i}-{v}"
            runs.append(
                dict(
                    sweep_dir=label, run_id=run_id, workload="user", workload_params=p, mode="inference", batch=v,
                    context=8, width=4, dtype="float32", device="cpu", device_kind="cpu", outcome="ok",
                    max_memory_allocated=1000 * v + i, max_memory_reserved=2000 * v, samples_per_s=10.0,
                )
            )  # fmt: skip
            counters = dict.fromkeys(match.COUNTERS, 1000 * v + i)
            phases.append(dict(sweep_dir=label, run_id=run_id, phase="inputs", phase_index=0, **counters))
    return Sweep(label, Path(label), "test", runs, phases)


class _NoPlots:
    def counters_plot(self, *args):
        return b""


def _result(monkeypatch, a: Sweep, b: Sweep):
    compare = importlib.import_module("memsweep.analysis.compare.compare")  # the module, not the function
    monkeypatch.setattr(compare, "load_sweep", lambda path, label, *cols: {"A": a, "B": b}[label])
    result = compare.compare([Path("A"), Path("B")])
    text = compare_text(result, None, None)
    page = to_markdown(compare_document(result, None, None, _NoPlots()), "plots")
    return result, text, page


def test_two_user_workloads_are_named_by_the_parameters_that_differ(monkeypatch):
    a, b = _sweep("A", [_params(3)]), _sweep("B", [_params(2, "mine.other")])
    result, text, page = _result(monkeypatch, a, b)
    (cmp,) = result.comparisons
    title = (
        "batch sweep (context=8 width=4 dtype=float32 workload=user model._target_=mine.build model.blocks=3) "
        "in A; model._target_=mine.other model.blocks=2 in B"
    )
    assert cmp.title == title
    (diff,) = [d for d in result.differences if d.field == "workload_params"]
    assert diff.values == ["model._target_=mine.build model.blocks=3", "model._target_=mine.other model.blocks=2"]
    for out in (text, page):
        assert title in out and "_target_\\" not in out and '"classes"' not in out and "/home/u" not in out
    assert max(map(len, text.splitlines())) < 400


def test_many_differing_parameters_are_named_by_a_stable_digest(monkeypatch):
    many = _params(2, "mine.other", dropout=0.1, heads=4)
    a, b = _sweep("A", [_params(3)]), _sweep("B", [many])
    result, text, page = _result(monkeypatch, a, b)
    (cmp,) = result.comparisons
    da, db = names.digest(_params(3)), names.digest(many)
    assert da != db and da == names.digest(json.loads(_params(3))) and len(da) == len("params#") + 8
    assert cmp.title.endswith(f"workload=user {da}) in A; {db} in B")
    for out in (text, page):
        assert f"| B: {db}" in out or f"| {db} |" in out
        assert cmp.title in out and "dropout" not in out


def test_loads_of_one_sweep_read_apart_and_a_load_alone_needs_no_name(monkeypatch):
    a = _sweep("A", [_params(3), _params(4)])
    b = _sweep("B", [_params(3), _params(4)])
    result, text, _ = _result(monkeypatch, a, b)
    titles = [c.title for c in result.comparisons]
    assert [t.endswith(f"model.blocks={n})") for t, n in zip(titles, (3, 4))] == [True, True], titles
    assert not result.differences  # the same loads in both sweeps
    one = match.series_of(_sweep("A", [_params(3)]))[0]
    match.name_series([one])
    assert one.title == "batch sweep (context=8 width=4 dtype=float32 workload=user)"


def test_a_pair_compared_without_compare_names_its_own_differences():
    base = match.series_of(_sweep("A", [_params(3)]))[0]
    other = match.series_of(_sweep("B", [_params(2)]))
    cmp = match.compare_series(base, other)
    assert cmp.title.endswith("workload=user model.blocks=3) in A; model.blocks=2 in B")
    assert render.text([base.sweep, other[0].sweep], [], [cmp], None, []).count("model.blocks=2") == 1
