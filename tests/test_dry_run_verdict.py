"""A dry run's verdict is its predicted peak against the capacity, end to end: a dry run never
runs out of memory, so a search or a run that read the worker's ``ok`` as "fits" would call any
load a fit (conf.contract.predicted_outcome)."""

import json
import subprocess

from memsweep.conf.contract import RESULT_FILE
from tests.data.loads import MEMSWEEP, NO_REPORT, search_events

# The mlp at context=8 width=16 predicts tens of KiB at batch 1: 4 KiB is below every value.
TINY = ["device=cpu", "context=8", "width=16", "capacity=4KiB"]


def memsweep(tmp_path, *args):
    return subprocess.run(
        [MEMSWEEP, *args, f"results_dir={tmp_path / 'res'}"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )


def test_a_dry_run_frontier_search_below_every_predicted_peak_reports_nothing_fits(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = memsweep(
        tmp_path,
        "sweep",
        "hydra/sweeper=frontier",
        "dry_run=true",
        *TINY,
        "hydra.sweeper.upper=64",
        "hydra.sweeper.confirm=0",
        *NO_REPORT,
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = search_events(sweep_dir)
    (result,) = [e for e in events if e["event"] == "result"]
    assert result["max_ok"] is None and result["min_oom"] == 1 and not result["upper_reached"]
    assert result["status"].startswith("lower bound does not fit")
    assert all(e["outcome"] == "oom" for e in events if e["event"] == "probe")
    assert "fits" not in result["status"].replace("does not fit", "")
    assert "does not fit (predicted" in proc.stdout + proc.stderr


def test_a_dry_run_frontier_search_without_a_capacity_is_refused(tmp_path):
    proc = memsweep(tmp_path, "sweep", "hydra/sweeper=frontier", "dry_run=true", "device=cpu", "context=8", "width=16")
    assert proc.returncode == 2 and "invalid capacity=None" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "res").rglob("spec.json"))


def test_memsweep_run_of_a_dry_run_exits_with_its_verdict_and_writes_it_in_result_json(tmp_path):
    proc = memsweep(tmp_path, "run", "dry_run=true", *TINY, f"hydra.run.dir={tmp_path / 'miss'}")
    assert proc.returncode == 3, proc.stderr[-2000:]  # predicted above the capacity: does not fit
    assert "does not fit (predicted" in proc.stdout + proc.stderr
    miss = json.loads((tmp_path / "miss" / RESULT_FILE).read_text())
    # the worker process ended well (outcome ok); the verdict is the prediction's
    assert (miss["outcome"], miss["returncode"], miss["predicted_outcome"]) == ("ok", 0, "oom")
    fit = ["device=cpu", "context=8", "width=16", "capacity=1GiB", f"hydra.run.dir={tmp_path / 'fit'}"]
    proc = memsweep(tmp_path, "run", "dry_run=true", *fit)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "fit" / RESULT_FILE).read_text())["predicted_outcome"] == "ok"


def test_a_card_whose_dry_run_failed_prints_dashes_never_none():
    """``memsweep predict --cards``: a missing figure is ``-`` (no Python ``None``), aligned under
    the head; a found edge prints its values (``?`` when not exact)."""
    from memsweep.sweeper.predict_cards import CARD_TABLE_HEAD, card_table_row

    failed = {
        "card": "NVIDIA T4",
        "capacity_bytes": 15 * 2**30,
        "max_fit": None,
        "min_miss": None,
        "exact": False,
        "peak_bytes": None,
        "error": "boom",
        "estimator_fixed_bytes": None,
        "estimator_edge": None,
    }
    line = card_table_row(failed)
    assert "None" not in line and line.split() == ["NVIDIA", "T4", "15.00", "none", "-", "-", "|", "-", "-"]
    assert len(line) == len(CARD_TABLE_HEAD)
    found = {**failed, "max_fit": 4, "min_miss": 8, "peak_bytes": 2**30, "estimator_fixed_bytes": 2**29}
    assert card_table_row({**found, "estimator_edge": 0}).split()[2:] == [
        "15.00",
        "4?",
        "8",
        "1.00",
        "|",
        "0.50",
        "none",
    ]


def test_the_cards_table_says_why_the_estimator_columns_are_dashes(monkeypatch):
    """The estimator reads an hf workload's config.json only: the footnote says '-' is another
    workload's (a new user took the dashes of the README's transformer example for a fault)."""
    import io

    from memsweep.sweeper import cli, predict_cards

    row = {
        "card": "NVIDIA T4", "capacity_bytes": 15 * 2**30, "max_fit": 4, "min_miss": 5, "exact": True,
        "peak_bytes": 2**30, "error": None, "estimator_fixed_bytes": None, "estimator_edge": None,
    }  # fmt: skip
    summary = {"load": {"batch": 1, "workload": {"name": "transformer"}}, "device": "cpu", "dry_runs": 3}
    summary.update(out_dir="d", cards=[row])
    monkeypatch.setattr(predict_cards, "predict_cards", lambda *a, **k: summary)
    out = io.StringIO()
    assert cli._predict_cards_command(["workload=transformer"], [], out) == 0
    text = " ".join(out.getvalue().split())
    assert "of an hf workload (its config.json); '-' for another workload, which the estimator does not read" in text
