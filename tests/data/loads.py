"""Loads the tests share and the ways they start memsweep, written once: Hydra overrides of the
tiny CPU load and the one that skips a sweep's report, tiny transformers configs (random weights,
nothing downloaded), the console script, a worker process on a written spec, the frontier
sweeper's log."""

import json
import subprocess
import sys
from pathlib import Path

from memsweep.conf.contract import SEARCH_LOG, SPEC_FILE
from memsweep.sweeper.process import worker_env

TINY_CPU = ["context=64", "width=64", "workload.depth=2", "warmup=1", "repeats=1", "threads=1", "device=cpu"]
"""Hydra overrides of a tiny mlp load on the CPU (a run takes seconds); add batch and capacity."""
SMALLEST_CPU = ["context=8", "width=16", "workload.depth=2", "warmup=1", "repeats=1", "threads=1", "device=cpu"]
"""The same with context 8 and width 16 (the sizes of tests/conftest.py's ``TINY``): for runs
whose memory does not matter, only that they run, fail or are killed."""

NO_REPORT = ["hydra.callbacks.analyze.report=false"]
"""The override that ends a sweep with its tables only, no report (``memsweep sweep`` on the command
line, ``overrides=`` of the API): for tests that never read the report, which costs a sweep
seconds of CPU (matplotlib, its figures). Tests of the report, its files, its path printed, or of
what the report step could change (exit status, processes, published or recovered files) keep it."""

MEMSWEEP = str(Path(sys.executable).with_name("memsweep"))
"""The installed console script beside this Python (``pip install -e .``), run as a user runs it."""

TINY_LLAMA_OVERRIDES = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}
"""transformers config overrides that shrink a Llama-shaped config (also Qwen2, Mistral, Phi-3):
2 layers, hidden 32, 4 heads of 8 (2 KV heads), MLP 64, vocabulary 128, 64 positions."""
TINY_HF_LLAMA = {"name": "hf", "config": "LlamaConfig", "overrides": TINY_LLAMA_OVERRIDES}
"""The hf workload on that tiny Llama."""
TINY_HF_GPT2 = {
    "name": "hf",
    "config": "gpt2",
    "overrides": {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 128, "n_positions": 64},
}
"""The hf workload on a tiny GPT-2: 2 layers, hidden 32, 4 heads, vocabulary 128, 64 positions."""


def run_worker(run_dir: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``python -m memsweep.worker run_dir/spec.json`` in ``run_dir`` as the sweeper starts a worker
    (``sweeper.process.worker_env``), output captured as text.

    Args: run_dir: a directory holding the spec file; timeout: seconds before
    ``subprocess.TimeoutExpired``. Returns: the finished process (its record is in run_dir).
    """
    return subprocess.run(
        [sys.executable, "-m", "memsweep.worker", str(run_dir / SPEC_FILE)],
        cwd=run_dir,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def search_events(sweep_dir: Path, event: str | None = None) -> list[dict]:
    """The frontier sweeper's log of a sweep (``search.jsonl``, one JSON object a line), in order.

    Args: sweep_dir: the sweep directory; event: keep only the objects of this ``event``
    ("start", "probe", "dry_run", "result", ...), or None for all. Returns: the objects.
    Raises: FileNotFoundError where the sweep wrote no log.
    """
    lines = [json.loads(x) for x in (Path(sweep_dir) / SEARCH_LOG).read_text().splitlines()]
    return [x for x in lines if event is None or x["event"] == event]
