"""Reports of many loads: a bounded page, every load reachable, failures named, the same tables.

A real tiny sweep (two runs: one fits, one runs out of memory) is copied into a synthesized sweep
of 8 loads of 20 runs (tests/bench/synth.py); nothing here is timed (speed: make bench BENCH=scale).
"""

import re
import subprocess

import pyarrow as pa
import pytest

from memsweep.analysis import tables
from memsweep.analysis.compare import compare
from memsweep.analysis.compare.render import IN_FULL, document
from memsweep.analysis.report import report_for_dirs
from memsweep.analysis.report.sections_scale import FULL_LOADS
from memsweep.conf.contract import RecordError, read_json
from tests.bench.synth import synthesize
from tests.data.loads import MEMSWEEP, NO_REPORT, TINY_CPU


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    real = ["sweep=none", "batch=4,64", "capacity=8MiB", *TINY_CPU, *NO_REPORT]  # its runs are copied, not its report
    cmd = [MEMSWEEP, "sweep", *real, f"hydra.sweep.dir={root}/real"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    return synthesize(root / "real", root / "many", 160)


def test_a_report_of_many_loads_is_bounded_and_reaches_every_load(many, tmp_path):
    report, md, html = report_for_dirs([many], tmp_path)
    assert len(report.axes) == 8
    assert len(report.doc.images) <= 5 * FULL_LOADS + 1  # not a plot set per load
    pages = sorted((tmp_path / "report_loads").iterdir())
    assert len(pages) == 8 and len(report.pages) == 8
    page = html.read_text()
    for p in pages:
        assert f"report_loads/{p.name}" in page  # every load linked from the page
    assert re.search(
        r"\b160\b", " ".join(b[1] for b in report.doc.blocks if b[0] == "p" and "failed otherwise" in b[1])
    )
    # the synthesized crash (run 5) is named on the page, with its directory
    text = md.read_text()
    assert "`5` (crash" in text
    # the loads shown in full have their runs' phases (read for them alone): the rise of the peak
    # by phase, and the current counters at the end of the edge run's last phase
    assert text.count("#### Phases (") == FULL_LOADS, text
    assert len(re.findall(r"^\| memory_allocated \| \d+ \|", text, re.M)) == FULL_LOADS, text
    # ... and in its load's runs table, as a crash with the signal that ended it
    assert any("<td>crash</td>" in p.read_text() and "killed by signal 9 (synthesized)" in p.read_text() for p in pages)


def test_reading_in_processes_gives_the_same_rows(many, monkeypatch):
    serial = tables.build_tables([many])
    monkeypatch.setattr(tables, "PARALLEL_FROM", 10)
    monkeypatch.setattr(tables, "CHUNK", 33)
    parallel = tables.build_tables([many])
    assert parallel.runs.equals(serial.runs) and parallel.phases.equals(serial.phases)
    assert parallel.problems == serial.problems
    assert serial.runs.num_rows == 160 and isinstance(serial.runs, pa.Table)


def test_a_comparison_of_many_loads_is_bounded(many):
    result = compare([many, many])
    doc = document(result.sweeps, result.differences, result.comparisons, None, result.regressions, _NoPlots())
    in_full = [b for b in doc.blocks if b[0] == "h" and " -> " in b[2]]
    assert len(result.comparisons) == 8 and len(in_full) == IN_FULL  # the other 4 in one table
    assert any(b[0] == "h" and b[2] == "Every pair of series" for b in doc.blocks)


class _NoPlots:
    def counters_plot(self, *args):
        return b""


@pytest.mark.parametrize("kind", ["fifo", "devzero", "huge", "deep"])
def test_the_reader_refuses_what_is_not_a_bounded_json_file(tmp_path, kind, monkeypatch):
    import os

    from memsweep.conf.contract import record

    path = tmp_path / "record.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        monkeypatch.setattr(record, "MAX_DOCUMENT_BYTES", 100)
        path.write_text('{"schema_version": 1, "x": "' + "a" * 200 + '"}')
    else:
        path.write_text('{"schema_version": 1, "x": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(RecordError) as err:
        read_json(path, "record")
    assert str(path) in str(err.value) and "\n" not in str(err.value)
