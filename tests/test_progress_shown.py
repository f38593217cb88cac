"""What a user sees while work runs: a sweep whose output is a terminal shows a live bar (tqdm on
stderr), not one line per run (those are for logs and pipes, checked in test_report.py; the
terminal here is a pseudo-terminal, Python's pty module, and two tiny CPU runs); ``memsweep
predict --cards`` says each card's edge as it is predicted."""

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time

import pytest

from tests.data.loads import MEMSWEEP, NO_REPORT, SMALLEST_CPU


def _run_on_a_terminal(args: list[str], cwd, timeout_s: float = 300, size=(40, 160)) -> tuple[int, str]:
    """Run ``args`` with stdout and stderr on a pseudo-terminal of ``size`` (lines, columns; (0, 0):
    a size never set, as under ``script -qc``); its exit status and all it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "MEMSWEEP_PROGRESS"}
    proc = subprocess.Popen(args, cwd=cwd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other end closed: the process ended
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    return rc, out.decode(errors="replace")


@pytest.mark.parametrize("size", [(40, 160), (0, 0)], ids=["160 columns", "no size"])
def test_a_sweep_on_a_terminal_shows_a_live_bar(tmp_path, size):
    """A terminal that reports no size (0 x 0) gets a bar 80 columns wide (tqdm sized by it drew nothing)."""
    rc, out = _run_on_a_terminal(
        [MEMSWEEP, "sweep", "sweep=none", "batch=1,2", *SMALLEST_CPU, *NO_REPORT] + [f"hydra.sweep.dir={tmp_path}/s"],
        tmp_path,
        size=size,
    )
    assert rc == 0, out[-3000:]
    assert "\r" in out and "2/2" in out and "memsweep:" in out, out[-3000:]  # the bar, redrawn in place
    assert "done, 0 left" not in out, "a bar, not the lines of a log: " + out[-3000:]
    assert "batch" in out.split("2/2")[-1] or "-> ok" in out, out[-3000:]  # the last run beside the bar


def test_each_card_is_reported_as_it_is_predicted(capsys):
    from memsweep.sweeper.callbacks import report_card

    row = {"card": "A100 80GB", "capacity_bytes": 80 * 2**30, "max_fit": 64, "min_miss": 128, "exact": True}
    report_card(2, 5, row, "batch")
    line = capsys.readouterr().err.strip()
    assert line.startswith("memsweep: card 2/5 A100 80GB (85899345920 B (80.000 GiB)): batch=64 fits, batch=128")
    assert line.endswith("(predicted)")
    report_card(1, 5, dict(row, max_fit=None, min_miss=1, error="boom"), "batch")
    assert "nothing fits, batch=1 does not; a dry run failed: boom" in capsys.readouterr().err


def test_the_bar_falls_back_to_80_columns_only_on_a_terminal_without_a_size():
    import io

    from memsweep.sweeper.progress import FALLBACK_SIZE, bar_size

    assert bar_size(io.StringIO()) == {"dynamic_ncols": True}  # a notebook's stream: tqdm sizes its widget
    for size, expected in (((0, 0), {"ncols": 80, "nrows": 24}), ((40, 160), {"dynamic_ncols": True})):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
        with os.fdopen(slave, "w") as stream:
            assert bar_size(stream) == expected, size
        os.close(master)
    assert FALLBACK_SIZE == (80, 24)
