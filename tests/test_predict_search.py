"""``memsweep predict``'s search and its command line: a bounded lattice (the frontier sweeper's
default bounds), a search that stops at the exact edge without running past a plateau of the
peak, and bad input refused in words before any dry run."""

import io
import json

from memsweep.sweeper.cli import predict_command as predict
from memsweep.sweeper.frontier_settings import FrontierSweeperConf
from memsweep.sweeper.search import FrontierSearch, Lattice, run_search

# eval_batch at small values: the training step's peak is larger than the eval's, so the peak is
# flat (a plateau) until the eval's grows past it
TRAIN_PEAK, EVAL_A, EVAL_B = 4_472_132, 2_248_768, 90_112
CAP = 6 * 2**20
EDGE = (CAP - EVAL_A) // EVAL_B  # the largest eval_batch whose eval fits: 44


def plateau_oracle(x):
    peak = max(TRAIN_PEAK, EVAL_A + EVAL_B * x)
    return ("ok" if peak <= CAP else "oom"), (peak if peak <= CAP else None), CAP


def test_a_plateau_does_not_send_the_model_far_past_the_edge():
    search = FrontierSearch("eval_batch", Lattice.make(1, 65536), "model", capacity=CAP, seed=1)
    result = run_search(search, plateau_oracle)
    assert (result.max_ok, result.min_oom, result.exact) == (EDGE, EDGE + 1, True)
    # twice doubling past the plateau (7 values) and a bisection of (32, 64), not 20 runs
    assert result.runs_used <= 12, [p.value for p in search.probes]
    assert max(p.value for p in search.probes) < 4 * EDGE


def test_predict_searches_the_frontier_sweepers_bounds_and_stops_at_the_exact_edge(tmp_path):
    out = io.StringIO()
    load = ["device=cpu", "width=64", "context=32", "mode=train", "eval_batch=1", "threads=1"]
    code = predict(load + ["--axis", "eval_batch", f"capacity={CAP}B", f"results_dir={tmp_path}"], out=out)
    assert code == 0, out.getvalue()
    summary = json.loads(next((tmp_path / "predict").glob("*/predict.json")).read_text())
    assert summary["exact"] and summary["min_miss"] == summary["max_fit"] + 1
    assert summary["upper"] == FrontierSweeperConf.upper and not summary["upper_reached"]
    runs = {r["value"]: r for r in summary["runs"]}
    assert runs[summary["max_fit"]]["fits"] and not runs[summary["min_miss"]]["fits"]
    assert max(runs) <= FrontierSweeperConf.upper
    assert summary["dry_runs"] <= 12, sorted(runs)  # 52, up to eval_batch=44198262, before


def test_predict_reports_an_upper_bound_not_reached(tmp_path):
    out = io.StringIO()
    load = ["device=cpu", "width=16", "context=8", "batch=1", "threads=1"]
    code = predict(load + ["capacity=1GiB", "--upper", "4", f"results_dir={tmp_path}"], out=out)
    assert code == 0, out.getvalue()
    assert "edge not found below the upper bound: batch=4 (--upper) fits" in out.getvalue()
    summary = json.loads(next((tmp_path / "predict").glob("*/predict.json")).read_text())
    assert summary["upper_reached"] and summary["upper"] == 4 and summary["min_miss"] is None


def test_predict_refuses_bad_input_in_words(tmp_path, capsys):
    base = ["capacity=4MiB", f"results_dir={tmp_path}"]
    assert predict(base + ["--bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown option --bogus" in err and "--axis AXIS" in err and "--upper N" in err
    assert "capacity=null" not in err and "dry_run=true" not in err
    assert predict(base + ["dry_run=false"]) == 2
    assert "invalid dry_run='false'" in capsys.readouterr().err
    assert predict(base + ["batch=["]) == 2  # the override named alone, none of memsweep's own
    err = capsys.readouterr().err
    assert "invalid override='batch=['" in err and "capacity=null" not in err
    assert predict(base + ["--upper", "0"]) == 2
    assert "invalid --upper='0'" in capsys.readouterr().err
    assert predict(base + ["--upper", "x2"]) == 2 and "invalid --upper='x2'" in capsys.readouterr().err
    assert not (tmp_path / "predict").exists()  # nothing ran


def test_predict_help_names_every_searchable_axis_and_the_strategy():
    from memsweep.sweeper.search import SEARCH_AXES

    out = io.StringIO()
    assert predict(["--help"], out=out) == 0
    text = out.getvalue()
    assert f"--axis {'|'.join(SEARCH_AXES)}" in text and "eval_batch" in SEARCH_AXES
    assert "model strategy" in text and "by bisection" not in text
    assert f"default {FrontierSweeperConf.upper}" in text
