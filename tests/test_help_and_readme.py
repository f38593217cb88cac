"""Everything a user is shown how to type answers without a traceback and with a documented exit
status: every subcommand's --help, and every command of the README's code blocks, shrunk
(tiny loads, a small capacity, paths under the test's directory). Commands a machine without
a GPU or SLURM cannot run are refused in one line (exit 2), which is a documented answer too."""

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


def readme_commands() -> list[list[str]]:
    """The memsweep commands of the README's code blocks (continuation lines joined)."""
    text = README.read_text().replace("\\\n", " ")
    out = []
    for block in re.findall(r"```bash\n(.*?)```|\n\n((?:    .*\n)+)", text, flags=re.S):
        for line in "".join(block).splitlines():
            line = line.split("  #")[0].strip()
            if re.match(r"^(\S+=\S+\s+)*(\.venv/bin/)?memsweep \w", line):
                words = shlex.split(line)
                start = next(i for i, w in enumerate(words) if "=" not in w and w.split("/")[-1] == "memsweep")
                out.append(words[start + 1 :])
    return out


def shrink(args: list[str], root: Path, sweep_dirs: list[Path]) -> list[str]:
    """The command with its load shrunk and its paths under ``root``."""
    command, rest = args[0], args[1:]
    shrunk = []
    dirs = iter(sweep_dirs)
    for word in rest:
        key = word.split("=", 1)[0]
        if command in ("run", "sweep", "predict") and key in SHRINK:
            continue
        if command in ("analyze", "report") and (word.startswith("results/") or word == "SWEEP_DIR"):
            word = str(next(dirs))
        elif word.startswith("/tmp/"):
            word = str(root / "out" / word[len("/tmp/") :])
        shrunk.append(word)
    if command in ("run", "sweep", "predict"):
        if command == "predict":
            shrunk = [w for w in shrunk if not w.startswith("capacity=")] + ["capacity=4MiB"]
        shrunk += [f"{k}={v}" for k, v in SHRINK.items() if not (command == "predict" and k == "capacity")]
        if any(w == "workload=transformer" for w in shrunk):
            shrunk += ["workload.vocab=64", "workload.layers=1"]
        shrunk += [f"results_dir={root / 'results'}"]
    return [command, *shrunk]


def test_readme_lists_commands_of_every_subcommand():
    assert {c[0] for c in readme_commands()} >= set(SUBCOMMANDS)


def test_every_readme_command_answers_without_a_traceback(tmp_path):
    made = []
    for i in range(2):  # sweep directories for the analyze and report examples
        made.append(tmp_path / f"made{i}")
        proc = subprocess.run(
            [
                MEMSWEEP,
                "sweep",
                "sweep=none",
                "batch=1,2",
                *shrink(["run"], tmp_path, [])[1:],
                f"hydra.sweep.dir={made[-1]}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    failures = []
    for n, args in enumerate(readme_commands()):
        argv = shrink(args, tmp_path / f"c{n}", made)
        proc = subprocess.run([MEMSWEEP, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        if "Traceback (most recent call last)" in proc.stdout + proc.stderr or proc.returncode not in DOCUMENTED:
            failures.append((argv, proc.returncode, proc.stderr[-1500:]))
    assert not failures, failures
