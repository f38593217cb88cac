"""Everything a user is shown how to type answers without a traceback and with a documented exit
status: every subcommand's --help here, and (with the functions of this module) every command of
the README's and the documentation pages' ``bash`` code blocks, shrunk (tiny loads, a small
capacity, paths under the test's directory, the sweep directories they name made first), in
tests/test_docs.py, which runs a command shown on several pages once. Commands a machine without a
GPU or SLURM cannot run are refused in one line (exit 2), which is a documented answer too."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from memsweep.conf.contract import RUN_EXIT
from tests.data.loads import MEMSWEEP

README = Path(__file__).resolve().parents[1] / "README.md"
SUBCOMMANDS = ("run", "sweep", "analyze", "report", "estimate", "predict", "env")
# README "Usage": run's outcomes, 2 bad input, 1 Hydra could not compose / a result already there, 130 interrupted
DOCUMENTED = set(RUN_EXIT.values()) | {1, 2, 130}
# The shrunk load of every run, sweep and predict: a tiny mlp (or transformer) and a small capacity.
SHRINK = {
    "context": "8",
    "width": "16",
    "warmup": "1",
    "repeats": "1",
    "threads": "1",
    "capacity": "4MiB",
}


def no_traceback(proc):
    assert "Traceback (most recent call last)" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert proc.returncode in DOCUMENTED, (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("argv", [["--help"], *[[c, "--help"] for c in SUBCOMMANDS]], ids=" ".join)
def test_every_help_answers(tmp_path, argv):
    proc = subprocess.run([MEMSWEEP, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    no_traceback(proc)
    assert proc.returncode == 0 and proc.stdout.strip()


# A fenced code block: its indentation, its language and its text (until a fence at that indentation).
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
SHELL_LANGS = ("bash", "sh", "shell")


def doc_commands(path: Path) -> list[list[str]]:
    """The memsweep commands of a Markdown file's shell code blocks (continuation lines joined,
    comments and environment assignments dropped): each as its arguments after ``memsweep``."""
    out = []
    for block in FENCE.finditer(path.read_text()):
        if block["lang"] not in SHELL_LANGS:
            continue
        for line in block["body"].replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if re.match(r"^(\S+=\S+\s+)*(\.venv/bin/)?memsweep \w", line):
                words = shlex.split(line)
                start = next(i for i, w in enumerate(words) if "=" not in w and w.split("/")[-1] == "memsweep")
                out.append(words[start + 1 :])
    return out


def readme_commands() -> list[list[str]]:
    """The memsweep commands of the README's code blocks."""
    return doc_commands(README)


# Placeholders the pages write for a sweep directory; each is given one of the made sweeps.
SWEEP_PLACEHOLDERS = ("SWEEP_DIR", "SWEEP_A", "SWEEP_B", "BASELINE", "CANDIDATE")


def shrink(args: list[str], root: Path, sweep_dirs: list[Path]) -> list[str]:
    """The command with its load shrunk and its paths under ``root``."""
    command, rest = args[0], args[1:]
    shrunk = []
    dirs = iter(sweep_dirs)
    for word in rest:
        key = word.split("=", 1)[0]
        if command in ("run", "sweep", "predict") and key in SHRINK:
            continue
        if command in ("analyze", "report", "compare") and (word.startswith("results/") or word in SWEEP_PLACEHOLDERS):
            word = str(next(dirs))
        elif word.startswith("/tmp/"):
            word = str(root / "out" / word[len("/tmp/") :])
        shrunk.append(word)
    if command in ("run", "sweep", "predict"):
        cards = command == "predict" and any(w.startswith("--cards") for w in shrunk)
        if cards:  # each card's own total is the capacity: the search is bounded instead
            shrunk = [w for w in shrunk if not w.startswith("capacity=")] + ["--upper", "64"]
        elif command == "predict":
            shrunk = [w for w in shrunk if not w.startswith("capacity=")] + ["capacity=4MiB"]
        shrunk += [f"{k}={v}" for k, v in SHRINK.items() if not (command == "predict" and k == "capacity")]
        if any(w == "workload=transformer" for w in shrunk):
            shrunk += ["workload.vocab=64", "workload.layers=1"]
        shrunk += [f"results_dir={root / 'results'}"]
    return [command, *shrunk]


def test_readme_shows_the_five_tasks_each_as_one_command():
    """Largest batch (the frontier sweeper), a card you lack (predict --cards), a CI gate (compare
    --fail-above), your own model (a user workload), a cluster sweep (+cluster=slurm)."""
    commands = [" ".join(c) for c in readme_commands()]
    for task in ("sweep hydra/sweeper=frontier", "predict ", "compare ", "workload=user", "+cluster=slurm"):
        assert any(task in c for c in commands), task
    assert any("--cards" in c for c in commands) and any("--fail-above" in c for c in commands)


def test_the_readme_is_short():
    assert len(README.read_bytes()) <= 10_000


def make_sweeps(root: Path, n: int = 2) -> list[Path]:
    """``n`` small finished sweep directories under ``root``, for the commands that read sweeps:
    their runs and tables (the sweep's end writes no report of its own; the pages' ``report``
    commands write theirs from the tables)."""
    made = []
    for i in range(n):
        made.append(root / f"made{i}")
        proc = subprocess.run(
            [
                MEMSWEEP,
                "sweep",
                "sweep=none",
                "batch=1,2",
                *shrink(["run"], root, [])[1:],
                f"hydra.sweep.dir={made[-1]}",
                "hydra.callbacks.analyze.report=false",
            ],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    return made


def failing_commands(
    commands: list[list[str]], root: Path, made: list[Path], answered: dict | None = None
) -> list[tuple]:
    """Run each command shrunk; (argv, exit status, stderr's end) of those that printed a traceback
    or exited with a status the docs do not give. ``answered`` keeps each command's answer (None:
    it passed) by its shrunk arguments: a command shown again (on another page given the same dict,
    with the same sweep directories) is answered from it instead of run twice."""
    answered = {} if answered is None else answered
    keys = []
    for n, args in enumerate(commands):
        keys.append(tuple(shrink(args, Path("ROOT"), made)))
        if keys[-1] not in answered:
            argv = shrink(args, root / f"c{n}", made)
            proc = subprocess.run([MEMSWEEP, *argv], cwd=root, capture_output=True, text=True, timeout=600)
            bad = "Traceback (most recent call last)" in proc.stdout + proc.stderr or proc.returncode not in DOCUMENTED
            answered[keys[-1]] = (argv, proc.returncode, proc.stderr[-1500:]) if bad else None
    return [answered[key] for key in dict.fromkeys(keys) if answered[key]]
