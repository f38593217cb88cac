"""Checks of what a user typed that no single field's validation covers, made before any
worker starts: keys nothing reads (``+bacth=16``), output directories that cannot be written,
a launcher whose cluster tool is missing. Each raises ``conf.contract.SpecError`` naming the
field, the value and what is accepted; ``sweeper.cli`` prints it and exits 2.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from memsweep.conf.contract import SpecError, check_writable, hf_config_kind, parse_size, path_kind, ranks_are_tasks

# Top-level keys of a composed config that memsweep reads besides the load's (sweeper.spec.LOAD_KEYS):
# the config groups, how runs are started, where results go.
OTHER_KEYS = ("workload", "sweep", "isolation", "pool", "cores_per_run", "results_dir")

# Hydra launchers that hand jobs to a cluster tool: the launcher class's name -> (its name in
# hydra/launcher=..., the tool it needs on the PATH).
LAUNCHER_TOOLS = {"SlurmLauncher": ("submitit_slurm", "sbatch")}


def unknown_key(key: str, value: Any, known: Iterable[str]) -> SpecError:
    """The refusal of a key nothing reads: its value, the closest accepted key, the accepted keys."""
    known = sorted(known)
    last = {k.rsplit(".", 1)[-1]: k for k in known}  # workload.depth is matched as depth
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(last), n=1)
    hint = f"; did you mean '{last[close[0]]}'?" if close else ""
    return SpecError(
        key, value, f"a key memsweep reads (nothing reads this one; a misspelling{hint}): " + ", ".join(known)
    )


def top_keys(load_keys: Iterable[str]) -> set[str]:
    """The top-level keys memsweep reads: the load's (``sweeper.spec.LOAD_KEYS``) and ``OTHER_KEYS``."""
    return set(load_keys) | set(OTHER_KEYS)


def check_known_keys(data: Mapping, known: Iterable[str]) -> None:
    """Refuse a top-level key that nothing reads: a misspelt key added with ``+`` (as Hydra's
    hint suggests for an unknown key) would otherwise run the baseline silently.

    Args:
        data: the composed config as a plain mapping, without its ``hydra`` node.
        known: the load's keys (``sweeper.spec.LOAD_KEYS``).

    Raises:
        SpecError: the first unknown key, with its value and the keys accepted.
    """
    accepted = top_keys(known)
    unknown = sorted(k for k in data if k not in accepted and k != "hydra")
    if unknown:
        raise unknown_key(unknown[0], data[unknown[0]], accepted)


def launcher_class(launcher_target: str | None) -> str:
    """The class name of a launcher's ``_target_`` (``hydra_plugins....SlurmLauncher`` -> ``SlurmLauncher``;
    ``""`` for None)."""
    return str(launcher_target or "").rsplit(".", 1)[-1]


def check_launcher(
    launcher_target: str | None, partition: str | None = None, sinfo: Callable[[], Any] | None = None
) -> None:
    """Refuse a launcher whose cluster tool is not installed here, or (submitit_slurm) a SLURM
    controller that cannot be reached or has no such partition, before any job is handed to it.

    Args:
        launcher_target: ``hydra.launcher._target_`` of the composed config.
        partition: ``hydra.launcher.partition`` (None: the cluster's default partition).
        sinfo: runs ``sinfo -h -o %R`` (the partitions, one a line) and returns the finished
            process (``stdout``, ``stderr``, ``returncode``); default: the real one, bounded by
            ``SLURM_PROBE_S`` seconds.

    Raises:
        SpecError: field ``hydra/launcher``, when the tool (``sbatch`` for submitit_slurm) is
            not on the PATH or sinfo cannot reach a controller (SLURM's first error line);
            ``hydra.launcher.partition``, a partition the controller does not list.
    """
    cls = launcher_class(launcher_target)
    if cls not in LAUNCHER_TOOLS:
        return
    name, tool = LAUNCHER_TOOLS[cls]
    elsewhere = "run on a SLURM login node, or use +cluster=local or hydra/launcher=joblib here"
    if shutil.which(tool) is None:
        raise SpecError(
            "hydra/launcher", name, f"a launcher this machine can use: {tool} is not on the PATH ({elsewhere})"
        )
    proc = (sinfo or _sinfo_partitions)()
    if proc is None or proc.returncode != 0:
        said = next((line for line in str(getattr(proc, "stderr", "") or "").splitlines() if line.strip()), "")
        raise SpecError(
            "hydra/launcher",
            name,
            f"a launcher this machine can use: sinfo reaches no SLURM controller ({said or 'no answer'}; "
            f"SLURM_CONF names the cluster's slurm.conf) ({elsewhere})",
        )
    partitions = sorted({line.strip() for line in str(proc.stdout).splitlines() if line.strip()})
    if partition is not None and str(partition) not in partitions:
        raise SpecError("hydra.launcher.partition", partition, "a partition of this cluster: " + ", ".join(partitions))


SLURM_PROBE_S = 30.0
"""How long ``check_launcher`` waits for sinfo (seconds)."""


def _sinfo_partitions() -> Any:
    """``sinfo -h -o %R`` (the partitions), or None when it did not answer within SLURM_PROBE_S."""
    try:
        return subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=SLURM_PROBE_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def launcher_name(launcher_target: str | None) -> str:
    """How a user names a launcher (``hydra/launcher=...``) from its ``_target_``: the name of
    LAUNCHER_TOOLS, else the class's name; ``basic`` for Hydra's default or an unknown one."""
    cls = launcher_class(launcher_target)
    if cls in LAUNCHER_TOOLS:
        return LAUNCHER_TOOLS[cls][0]
    return cls if cls and cls != "BasicLauncher" else "basic"


def check_run_launcher(launcher_target: str | None) -> None:
    """Refuse ``memsweep run`` with a launcher (``+cluster=slurm``, ``hydra/launcher=joblib``): a
    run never goes through one (Hydra's run mode starts no launcher), so the run would go on
    here, on this machine, instead of where the user meant it to.

    Args:
        launcher_target: ``hydra.launcher._target_`` of the run's composed config.

    Raises:
        SpecError: field ``hydra/launcher``, any launcher but Hydra's basic one, saying to use
            ``memsweep sweep``.
    """
    name = launcher_name(launcher_target)
    if name != "basic":
        raise SpecError(
            "hydra/launcher",
            name,
            "no launcher with `memsweep run` (a run starts no launcher: it would run here, on this machine); "
            "to hand runs to a launcher or a cluster, sweep them: memsweep sweep sweep=none <the same overrides> "
            "with the values as a list (batch=1,2,4; one condition: 'batch=choice(4)')",
        )


def check_task_ranks(spec: Any, launcher_target: str | None, environ: Mapping[str, str] | None = None) -> None:
    """Refuse ranks as SLURM tasks (``conf.contract.ranks_are_tasks``: ``tasks_per_node`` on a
    ddp/fsdp run) where no SLURM task will run them, before any worker starts: outside a SLURM
    task (no ``SLURM_PROCID``) and not handed to SLURM by the sweep's launcher (submitit_slurm).
    The worker refuses the same spec by the same rule (``worker.ranks.task_rendezvous``).

    Args:
        spec: the run's ``RunSpec``.
        launcher_target: ``hydra.launcher._target_`` of the sweep's composed config; None (or
            Hydra's basic launcher, that of ``memsweep run``) hands nothing to SLURM.
        environ: the environment (default ``os.environ``).

    Raises:
        SpecError: field ``tasks_per_node``.
    """
    env = os.environ if environ is None else environ
    if not ranks_are_tasks(spec) or env.get("SLURM_PROCID") is not None:
        return
    if launcher_name(launcher_target) != LAUNCHER_TOOLS["SlurmLauncher"][0]:
        raise SpecError(
            "tasks_per_node",
            spec.tasks_per_node,
            "null outside a SLURM job (no SLURM_PROCID here, and no submitit_slurm launcher to submit it): ranks "
            "as SLURM tasks need memsweep sweep +cluster=slurm; without tasks_per_node the worker forks the "
            "world_size ranks on this machine",
        )


def sweeper_kind(target: Any) -> str:
    """The short name of a sweeper from its ``_target_`` (``...OvatSweeper`` -> ``ovat``)."""
    name = str(target or "unknown").rsplit(".", 1)[-1]
    return name[: -len("Sweeper")].lower() if name.endswith("Sweeper") and name != "Sweeper" else name


def check_sweep_config(config: Any) -> None:
    """Check a sweep's settings that no run's spec holds, before anything is written: the
    output directories, the launcher, and that the sweep directory holds no other sweeper's
    sweep (a sweep directory holds one sweep; the analysis reads all of it as one).

    Args:
        config: the sweep's composed config (with its ``hydra`` node).

    Raises:
        SpecError: ``results_dir`` or ``hydra.sweep.dir`` that cannot be written, a launcher
            whose tool is missing or whose cluster cannot take the jobs (``check_launcher``), a bad
            report margin, or a ``hydra.sweep.dir`` whose ``multirun.yaml`` names another sweeper.
    """
    from omegaconf import OmegaConf

    check_writable("results_dir", config.get("results_dir", "results"))
    sweep_dir = Path(str(config.hydra.sweep.dir))
    check_writable("hydra.sweep.dir", sweep_dir)
    check_launcher(
        OmegaConf.select(config, "hydra.launcher._target_"), OmegaConf.select(config, "hydra.launcher.partition")
    )
    check_report_margin(OmegaConf.select(config, "hydra.callbacks.analyze.margin"), config.get("capacity"))
    mine = sweeper_kind(OmegaConf.select(config, "hydra.sweeper._target_"))
    earlier = sweep_dir / "multirun.yaml"
    if earlier.is_file():
        try:
            theirs = sweeper_kind(OmegaConf.select(OmegaConf.load(earlier), "hydra.sweeper._target_"))
        except Exception as exc:  # an unreadable multirun.yaml: not a directory to add a sweep to
            raise SpecError(
                "hydra.sweep.dir", str(sweep_dir), f"a new directory ({earlier} unreadable: {exc})"
            ) from None
        if theirs != mine:
            raise SpecError(
                "hydra.sweep.dir",
                str(sweep_dir),
                f"a new directory, or one of the {mine} sweeper to resume: it holds a sweep of the {theirs} sweeper "
                "(a sweep directory holds one sweep)",
            )


def module_exists(dotted: str, paths: Iterable[str]) -> bool:
    """Whether the module ``dotted`` can be found, without executing it nor its packages
    (``importlib.machinery.PathFinder``, one package level at a time: this process never
    imports a user's code, which may import torch).

    Args:
        dotted: a module name (``memsweep.conf.examples.convnet``).
        paths: directories searched before ``sys.path``.

    Returns:
        True when a module or package of that name is found.
    """
    if dotted in sys.modules:
        return True
    parts = dotted.split(".")
    # The top level: the workload's paths and sys.path, then every finder (an installed package's
    # own, such as an editable install's); finding a top-level module executes nothing.
    found = PathFinder.find_spec(parts[0], [*paths, *sys.path]) or importlib.util.find_spec(parts[0])
    for i in range(1, len(parts)):
        search = list(found.submodule_search_locations or []) if found is not None else []
        if not search:
            return False
        found = PathFinder.find_spec(".".join(parts[: i + 1]), search)
    return found is not None


def check_workload_sources(workload: dict) -> dict:
    """Check what a workload reads from this machine, before any worker starts: the hf
    workload's local config file, a user workload's ``_target_`` modules.

    Args:
        workload: the validated workload (``conf.contract.validate_workload``; a user
            workload's ``path`` already set).

    Returns:
        The workload, an hf config path made absolute (the worker runs in its run directory).

    Raises:
        SpecError: ``workload.config`` naming no config.json; ``workload.<fn>._target_`` whose
            module cannot be found on ``workload.path`` and ``sys.path``.
    """
    if workload["name"] == "hf" and workload["config"] is not None and hf_config_kind(workload["config"]) == "path":
        path = Path(workload["config"]).expanduser().absolute()
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            kind = path_kind(file)  # (a FIFO, a device: not read)
            what = "does not exist" if kind is None else f"is {kind}"
            raise SpecError("workload.config", workload["config"], f"a config.json, a regular file ({file} {what})")
        check_config_json(workload["config"], file)
        return {**workload, "config": str(path)}
    if workload["name"] == "user":
        for fn in ("model", "inputs", "loss", "optimizer", "train_step"):
            target = (workload.get(fn) or {}).get("_target_")
            if not target:
                continue
            module = target.rsplit(".", 1)[0] if "." in target else target
            if not module_exists(module, workload.get("path") or []):
                raise SpecError(
                    f"workload.{fn}._target_",
                    target,
                    f"a function of a module found on workload.path or sys.path (no module {module!r})",
                )
    return workload


MAX_CONFIG_BYTES = 16 * 2**20
"""The largest hf config.json read before a run (bytes; published configs are a few KiB)."""


def check_config_json(given: Any, file: Path) -> None:
    """Refuse an hf ``workload.config`` file that is no config.json, as ``memsweep estimate
    --config`` does (``estimator.hf_config.read_config_json``): not JSON (``/etc/passwd``), not a
    JSON object, nested too deep to parse, or larger than ``MAX_CONFIG_BYTES``.

    Args:
        given: the setting as typed.
        file: the config.json it names.

    Raises:
        SpecError: field ``workload.config``, saying what the file is.
    """
    from memsweep.estimator.hf_config import read_config_json

    accepted = "a Hugging Face config.json (a JSON object)"
    try:
        size = file.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise SpecError("workload.config", given, f"{accepted} of at most {MAX_CONFIG_BYTES} bytes ({size})")
        data = read_config_json(file)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        if isinstance(exc, SpecError):
            raise
        raise SpecError("workload.config", given, f"{accepted}: {str(exc).splitlines()[0][:200]}") from None
    except RecursionError:
        raise SpecError("workload.config", given, f"{accepted}: {file} is nested too deep to read") from None
    if not isinstance(data, dict):
        raise SpecError("workload.config", given, f"{accepted}: {file} holds a JSON {type(data).__name__}")


def check_report_margin(margin: Any, capacity: Any = None) -> None:
    """Check the sweep's report margin (``hydra.callbacks.analyze.margin``) before any run, not
    after the last one.

    Args:
        margin: the setting (None: the default).
        capacity: the sweep's ``capacity`` setting (``"8MiB"``; None: the device's own, not known
            before a run; a value that does not parse is left to the spec's own check).

    Raises:
        SpecError: field ``hydra.callbacks.analyze.margin``, a margin ``analysis.report``
            does not read, or a fixed one not below the emulated capacity (nothing could fit).
    """
    from memsweep.estimator.margin import parse_margin, refuse_margin_at_capacity

    try:
        policy = parse_margin(margin)
    except SpecError as exc:
        raise SpecError("hydra.callbacks.analyze.margin", margin, exc.accepted) from None
    try:
        capacity_bytes = None if capacity is None else parse_size(capacity, "capacity")
    except SpecError:
        return
    refuse_margin_at_capacity(policy, capacity_bytes, "hydra.callbacks.analyze.margin", f" (capacity={capacity})")


POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")
"""Config keys that hold a transformers model's number of positions, in the order read."""

BAD_CONFIG_ERRORS = ("has no such class", "Unrecognized model identifier", "has no model_type")
"""Fragments of the count worker's error that say the hf ``workload.config`` names no config."""

UNCOUNTED_ERRORS = ("transformers is not installed", "No module named", "the count worker gave no answer")
"""Fragments of the count's error that say nothing of the config (a package missing here, a count
worker that died): the run goes on uncounted."""


def check_hf_model(spec: Any, count: Mapping[str, Any] | None) -> None:
    """Check an hf run's model before any worker starts, from the count worker's answer
    (``sweeper.spec.hf_count``: transformers' config built on the meta device, in a worker):
    the config class or model type exists, and the positions the run needs fit the model's.

    Args:
        spec: the run's ``RunSpec`` (``workload`` hf; ``context``, and ``new_tokens`` in generate).
        count: the count's answer (``count_config``'s dict: ``config`` the resolved text config's
            values), or ``{"error": ...}``; None: nothing to check.

    Raises:
        SpecError: field ``workload.config`` (no such class or model type, or any other failure of
            the count but a missing transformers: the worker's words),
            or ``context`` above the model's ``max_position_embeddings`` (``n_positions`` for GPT-2).
    """
    if not count:
        return
    error = str(count.get("error") or "")
    if any(fragment in error for fragment in BAD_CONFIG_ERRORS):
        config = spec.workload.get("config")
        words = error.split(": ", 1)[-1].removeprefix(f"workload.config={config!r}: ")[:300]
        raise SpecError(
            "workload.config",
            config,
            f"a transformers config class (LlamaConfig), a model type (llama) or a config.json that exists ({words})",
        )
    if error and not any(fragment in error for fragment in UNCOUNTED_ERRORS):  # as memsweep estimate --config
        raise SpecError(
            "workload.config",
            spec.workload.get("config"),
            f"a config transformers builds on the meta device within timeout_s={spec.timeout_s:g} s "
            f"({error.splitlines()[0][:300] if error else ''})",
        )
    resolved = count.get("config")
    values: Mapping[str, Any] = resolved if isinstance(resolved, Mapping) else {}
    limit = next((values[k] for k in POSITION_KEYS if isinstance(values.get(k), int)), None)
    needed = spec.context + (spec.new_tokens if spec.mode == "generate" else 0)
    if limit is not None and needed > limit:
        key = next(k for k in POSITION_KEYS if values.get(k) == limit)
        also = f" (context {spec.context} + new_tokens {spec.new_tokens})" if spec.mode == "generate" else ""
        raise SpecError(
            "context",
            spec.context,
            f"at most the model's {key} = {limit} positions{also}; to measure a longer context, raise it with "
            f"+workload.overrides.{key}=N (a frontier search on context: hydra.sweeper.upper={limit} keeps within it)",
        )
