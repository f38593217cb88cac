"""A sweep's tables read in the place of its run directories only while they are current
(analysis/current.py): the same report either way, and every change to the runs sends the
report back to the run directories."""

import os
from contextlib import nullcontext

import pyarrow.parquet as pq
import pytest

from memsweep.analysis.current import READ_SINCE_KEY, READER_KEY, current_tables
from memsweep.analysis.outputs import OUTPUTS, write_tables
from memsweep.analysis.report import build, find_analysis_files, report_for_dirs
from memsweep.analysis.tables import build_tables
from tests.test_analysis_honesty import write_run

READ_LINE = "this report read those tables, not the run directories"


@pytest.fixture
def analysed(tmp_path):
    """A sweep of 4 runs (batch 1..8; the last one an OOM) whose tables were written into it."""
    sweep = tmp_path / "sweep"
    for i, batch in enumerate((1, 2, 4, 8)):
        write_run(sweep / str(i), batch=batch, outcome="oom" if batch == 8 else "ok")
    _age(sweep)
    write_tables([sweep], sweep)
    return sweep


def _age(sweep, seconds=60):
    """Every run directory and file of ``sweep`` modified ``seconds`` ago (before tables written now)."""
    past = os.stat(sweep).st_mtime - seconds
    for root, dirs, files in os.walk(sweep):
        for name in dirs + files:
            os.utime(os.path.join(root, name), (past, past))


def _current(sweep):
    return current_tables(sweep, find_analysis_files(sweep))


def test_current_tables_are_the_tables_the_runs_give(analysed):
    found = _current(analysed)
    assert found is not None
    runs, phases, _ = build_tables([analysed])
    assert found.runs.equals(runs) and found.phases.equals(phases)
    assert found.files == [analysed / "runs.parquet", analysed / "phases.parquet"]


def test_the_report_of_current_tables_is_the_report_of_the_runs(analysed, tmp_path, monkeypatch):
    monkeypatch.setattr(build, "figure_pool", lambda: nullcontext(build._NoPlots()))  # the text is compared
    from_tables = report_for_dirs([analysed], tmp_path / "a").md.read_text()
    (analysed / "runs.parquet").unlink()  # no tables: the runs are read
    from_runs = report_for_dirs([analysed], tmp_path / "b").md.read_text()

    def body(text):  # the time it was generated and the raw section's list of tables differ
        return [line for line in text.splitlines() if not line.startswith(("Generated ", "- `", "- this report"))]

    assert READ_LINE in from_tables and READ_LINE not in from_runs
    assert body(from_tables) == body(from_runs)


def _touch_record(sweep):
    os.utime(sweep / "1" / "record.json")


def _remove_run(sweep):
    for name in os.listdir(sweep / "3"):
        os.unlink(sweep / "3" / name)
    os.rmdir(sweep / "3")


def _add_run(sweep):
    write_run(sweep / "4", batch=16)


def _rewrite_result_keeping_time(sweep):
    path = sweep / "2" / "result.json"
    before = os.stat(path)
    path.write_text(path.read_text().replace('"wall_s": 1.0', '"wall_s": 2.0'))
    os.utime(sweep / "2", ns=(before.st_atime_ns, before.st_mtime_ns))  # only the file's own time moves


@pytest.mark.parametrize("change", [_touch_record, _remove_run, _add_run, _rewrite_result_keeping_time])
def test_a_run_changed_since_the_tables_were_written_is_read_again(analysed, change):
    change(analysed)
    assert _current(analysed) is None


def test_tables_of_another_reader_are_not_read(analysed):
    path = analysed / "runs.parquet"
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({READER_KEY: b"0" * 64}), path)
    assert _current(analysed) is None


def test_tables_of_the_sweep_named_absolute_are_read_under_the_name_given(analysed, monkeypatch):
    """The sweep's own analysis names its directory absolute; a user types it relative: the tables
    are read, their sweep_dir and run_dir in the name given, equal to what reading the runs gives."""
    monkeypatch.chdir(analysed.parent)
    relative = analysed.relative_to(analysed.parent)
    found = _current(relative)
    assert found is not None
    runs, phases, _ = build_tables([relative])
    assert found.runs.equals(runs) and found.phases.equals(phases)
    assert set(found.runs.column("run_dir").to_pylist()) == {f"sweep/{i}" for i in range(4)}


def test_tables_of_a_relative_name_are_read_under_that_name_only(analysed, monkeypatch):
    """A relative name in the tables (``memsweep analyze sweep`` from its parent) says nothing of the
    directory it was relative to: read under that same name only, not under another name of it."""
    monkeypatch.chdir(analysed.parent)
    for name in OUTPUTS:
        (analysed / name).unlink()
    relative = analysed.relative_to(analysed.parent)
    write_tables([relative], relative)
    assert _current(analysed) is None
    assert _current(relative) is not None


def test_a_run_changed_while_the_tables_were_built_is_read_again(analysed):
    """A record rewritten after the reading began but before the tables were written is in them as
    it was: the time the reading began (in the tables' metadata) is what the runs must predate."""
    meta = pq.read_schema(analysed / "runs.parquet").metadata
    since = int(meta[READ_SINCE_KEY])
    written = os.stat(analysed / "runs.parquet").st_mtime_ns
    assert since < written
    os.utime(analysed / "1" / "record.json", ns=(since + 1, since + 1))  # before the tables' own time
    assert _current(analysed) is None
