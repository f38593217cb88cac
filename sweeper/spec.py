"""Composed Hydra config -> validated RunSpec, before any worker starts.

Runs in the Hydra process, which never imports torch nor initialises CUDA: facts about
a GPU (is it visible, does it do bfloat16, how much memory) come from a short probe
process (``python -m memsweep.worker --probe DEVICE``), cached per device for the process and its
children (environment variable ``MEMSWEEP_PROBE_<device>``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from collections.abc import Callable
from typing import Any

from memsweep.conf.contract import (
    AXES,
    DEFAULT_ISOLATION,
    ISOLATIONS,
    MODES,
    RunSpec,
    SpecError,
    bytes_text,
    meminfo_bytes,
    parse_size,
    validate_device,
    validate_workload,
)
from memsweep.conf.contract.ask import ask_worker

from .errors import InputRefused
from .finetune import check_host_options

LOAD_KEYS = (
    *AXES,
    "mode",
    "device",
    "capacity",
    "capacity_mode",
    "warmup",
    "repeats",
    "timeout_s",
    "seed",
    "threads",
    "fault",
    # mode options (conf.contract.RunSpec; eval_batch, an axis too, is among AXES)
    "precision",
    "optimizer",
    "checkpointing",
    "micro_steps",
    "export",
    "new_tokens",
    "kv_cache",
    "dry_run",
    "snapshot_on_oom",
    "devices",
    "compile",
    "parallel",
    "world_size",
    "reshard_after_forward",
    "nodes",
    "tasks_per_node",
)


def check_optional_packages(spec: RunSpec) -> None:
    """Refuse, before any worker starts, a spec whose optional package is not installed here.

    Looked up with importlib.util.find_spec (nothing imported). Raises SpecError.
    """
    import importlib.util

    if spec.workload_name == "hf" and importlib.util.find_spec("transformers") is None:
        raise SpecError("workload", "hf", "an installed transformers package: pip install 'memsweep[hf]'")
    if spec.mode == "train" and spec.optimizer == "adamw8bit" and importlib.util.find_spec("bitsandbytes") is None:
        raise SpecError(
            "optimizer",
            "adamw8bit",
            "an installed bitsandbytes package (pip install bitsandbytes), or one of adamw, sgd, adafactor",
        )


def _env_cached(key: str, compute: Callable[[], dict]) -> dict:
    """``compute()``'s JSON answer, cached for this process and its children in the environment
    variable ``key`` (a sweep's jobs and workers inherit it): computed once per key."""
    cached = os.environ.get(key)
    if cached:
        return json.loads(cached)
    answer = compute()
    os.environ[key] = json.dumps(answer)
    return answer


def probe_device(device: str) -> dict:
    """Describe ``device`` by running ``python -m memsweep.worker --probe`` in a separate process.

    Returns the probe's JSON: ``device`` (resolved), ``available``, ``reason``,
    ``total_memory`` (bytes), ``bf16_supported``. Raises SpecError when the probe fails.
    """

    def probe() -> dict:
        try:
            return ask_worker("--probe", device)
        except RuntimeError as exc:
            raise SpecError("device", device, f"a device the worker can probe (probe failed: {exc})") from None

    return _env_cached("MEMSWEEP_PROBE_" + re.sub(r"[^A-Za-z0-9]", "_", device), probe)


def _plain(cfg: Any) -> dict:
    """A composed config (DictConfig or mapping) as a plain dict, interpolations resolved."""
    from omegaconf import DictConfig, OmegaConf

    from .plain import plain_dict

    if isinstance(cfg, DictConfig):  # drop the hydra node first: its job-time values are unset here
        data = plain_dict(cfg, resolve=False)
        data.pop("hydra", None)
        return plain_dict(OmegaConf.create(data), resolve=True)
    data = dict(cfg)
    data.pop("hydra", None)
    return data


def launch_settings(cfg: Any) -> dict:
    """How runs are started (not part of what they measure): isolation, pool, cores_per_run.

    A setting the config lacks takes its default (isolation: ``DEFAULT_ISOLATION``, as in
    conf/config.yaml).

    Raises:
        SpecError: an unknown isolation or pool, or a bad cores_per_run.
    """
    from .pool import POOLS

    get = cfg.get if hasattr(cfg, "get") else dict(cfg).get
    settings = {
        "isolation": get("isolation", DEFAULT_ISOLATION),
        "pool": get("pool", "none"),
        "cores_per_run": get("cores_per_run", 1),
    }
    if settings["isolation"] not in ISOLATIONS:
        raise SpecError("isolation", settings["isolation"], "one of " + ", ".join(ISOLATIONS))
    if settings["pool"] not in POOLS:
        raise SpecError("pool", settings["pool"], "one of " + ", ".join(POOLS))
    n = settings["cores_per_run"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SpecError("cores_per_run", n, "an integer >= 1")
    if settings["pool"] == "cores":
        from .pool import core_slots

        core_slots(n)  # SpecError when a run would need more cores than this node has
    return settings


def checked_spec(cfg: Any, run: bool = False) -> RunSpec:
    """``launch_settings`` and ``spec_from_config`` of a config composed inside Hydra, bad input
    refused as ``InputRefused``.

    ``InputRefused`` passes through Hydra's job runner (it only catches Exception), so nothing
    is launched and no traceback hides the message: ``sweeper.cli`` prints it and exits 2.

    Args:
        cfg: the composed config (a run, a sweep's baseline, or one of its conditions).
        run: the config of a ``memsweep run`` (Hydra's run mode, which starts no launcher: one is
            refused, ``sweeper.inputs.check_run_launcher``).

    Returns:
        Its ``RunSpec``.

    Raises:
        InputRefused: the first bad field, carrying the ``SpecError`` (field, value, accepted).
    """
    from .inputs import check_run_launcher, check_task_ranks

    try:
        launcher = _launcher_target(cfg)
        if run:
            check_run_launcher(launcher)
        launch_settings(cfg)
        spec = spec_from_config(cfg)
        check_task_ranks(spec, None if run else launcher)
        return spec
    except SpecError as exc:
        raise InputRefused(exc) from None


def _launcher_target(cfg: Any) -> str | None:
    """``hydra.launcher._target_`` of ``cfg``, else of the running Hydra job; None when neither says."""
    from omegaconf import OmegaConf

    target = OmegaConf.select(cfg, "hydra.launcher._target_", default=None) if OmegaConf.is_config(cfg) else None
    if target is None:
        try:
            from hydra.core.hydra_config import HydraConfig

            target = HydraConfig.get().launcher.get("_target_")
        except ValueError:  # no Hydra job (a test's plain config)
            return None
    return None if target is None else str(target)


def spec_from_config(cfg: Any) -> RunSpec:
    """Validate a composed config and turn it into a RunSpec.

    Checks every field (naming it and the accepted values on error), resolves
    ``device=auto`` (cuda:0 when a GPU is visible, else cpu), and checks against the
    device that it is visible, that it supports the dtype (bfloat16), that an emulated
    ``capacity`` does not exceed its total memory and that ``devices`` does not exceed the
    GPUs visible (probe ``device_count``).

    A dry run on a CUDA device (``dry_run=true device=cuda`` or ``cuda:N``) is the exception:
    fake CUDA tensors need no GPU, so the device is not probed (``cuda`` becomes ``cuda:0``) and
    none of these device checks apply: its total memory, bfloat16 support and device count are
    unknown here (a prediction for a CUDA device is checked against ``capacity`` only, by
    ``memsweep predict``). The device string is still validated.

    Raises:
        SpecError: the first bad field found, or a top-level key nothing reads (``+bacth=16``).
    """
    from .inputs import check_known_keys, check_workload_sources

    data = _plain(cfg)
    check_known_keys(data, LOAD_KEYS)
    workload = validate_workload(data.get("workload"))
    if workload["name"] == "user" and workload.get("path") is None:
        # the worker runs in its run directory: let it import the user's modules from here
        workload["path"] = [os.getcwd()]
    workload = check_workload_sources(workload)
    if data.get("mode") not in MODES:
        raise SpecError("mode", data.get("mode"), "one of " + ", ".join(MODES))
    device = validate_device(data.get("device"))
    capacity = data.get("capacity")
    capacity_bytes = None if capacity is None else parse_size(capacity, "capacity")
    info = None
    if data.get("dry_run") is True and device.startswith("cuda"):
        # A CUDA dry run runs fake CUDA tensors: no GPU is needed, none is probed. The device's
        # properties (total memory, bfloat16 support, device count) stay unknown, never invented.
        device = "cuda:0" if device == "cuda" else device
    elif device != "cpu":
        info = probe_device(device)
        if not info.get("available"):
            raise SpecError("device", device, f"a visible device ({info.get('reason')}); device=cpu runs on the CPU")
        device = info["device"]
    fields = {k: data.get(k) for k in LOAD_KEYS if k in data}
    fields.pop("capacity", None)
    fields.update(device=device, capacity_bytes=capacity_bytes, workload=workload)
    spec = RunSpec.from_dict(fields)
    check_optional_packages(spec)
    if spec.workload_name == "user":
        check_user_step(spec.workload)
    spec = check_host_options(spec)  # a checkpoint directory, peft / bitsandbytes, a compiler
    check_against_device(spec, info, capacity, capacity_bytes)
    return with_estimate(spec)


def check_against_device(spec: RunSpec, info: dict | None, capacity: Any, capacity_bytes: int | None) -> None:
    """Check a spec against its device: bfloat16 support, the GPUs visible, an emulated capacity
    within the device's total memory (on the CPU: within the machine's MemTotal).

    Args:
        spec: the spec.
        info: ``probe_device``'s answer for a CUDA device; None when the device was not probed
            (the CPU, a CUDA dry run).
        capacity: the ``capacity`` field as given (named in the error).
        capacity_bytes: ``capacity`` in bytes, or None (the device's own memory).

    Raises:
        SpecError: the first field the device refuses (dtype, devices, world_size or
            tasks_per_node, capacity).
    """
    if info is not None and info.get("device_kind") == "cuda":
        if spec.dtype == "bfloat16" and not info.get("bf16_supported"):
            raise SpecError("dtype", spec.dtype, f"a dtype {info.get('device_name')} supports: float32, float16")
        count = info.get("device_count")
        if spec.devices > 1 and isinstance(count, int) and spec.devices > count:
            raise SpecError("devices", spec.devices, f"at most the {count} GPU(s) visible here")
        per_node = spec.ranks_per_node  # the ranks that share one machine's GPUs
        if per_node > 1 and isinstance(count, int) and per_node > count:
            field = "world_size" if spec.tasks_per_node is None else "tasks_per_node"
            raise SpecError(field, per_node, f"at most the {count} GPU(s) visible here (one per rank)")
        total = info.get("total_memory")
        if capacity_bytes is not None and total and capacity_bytes > total:
            raise SpecError("capacity", capacity, f"at most the device's total_memory, {total} bytes")
    if spec.device == "cpu" and capacity_bytes is not None and not spec.dry_run:
        # The CPU emulation makes allocations past the capacity fail (the tracker's OutOfMemoryError,
        # or RLIMIT_DATA); above the machine's memory the kernel's OOM killer, not the limit, would
        # end the run.
        total = meminfo_bytes("MemTotal")
        if total is not None and capacity_bytes > total:
            raise SpecError(
                "capacity",
                capacity,
                f"at most this machine's memory on the CPU, MemTotal = "
                f"{bytes_text(total)}; dry_run=true predicts any size",
            )


def with_estimate(spec: RunSpec) -> RunSpec:
    """``spec`` with its ``estimate`` (estimator/, bytes by component) and
    ``estimate_missing_reason`` filled in, for every workload (``estimator.estimate_run``).

    An ``hf`` run's model is counted by transformers in a worker process (``hf_count``), once per
    distinct config and overrides: no torch is imported here. That count also checks the hf
    model (``sweeper.inputs.check_hf_model``).

    Raises:
        SpecError: an hf config that names no model, or a context above its positions.
    """
    from memsweep.estimator import estimate_run

    from .inputs import check_hf_model

    count = hf_count(spec.workload, timeout=min(600.0, spec.timeout_s)) if spec.workload_name == "hf" else None
    check_hf_model(spec, count)  # the config names a model, the context fits its positions
    estimate, reason = estimate_run(spec, count)
    return dataclasses.replace(
        spec, estimate=None if estimate is None else estimate.to_dict(), estimate_missing_reason=reason
    )


def check_user_step(workload: dict, timeout: float = 300) -> None:
    """Check a user workload's functions before any worker starts: a worker process imports the
    model, inputs, loss, optimizer and train_step factories and binds each call
    (``python -m memsweep.worker --check-user``, ``worker.workloads.user.check_user_targets``; this
    process never imports the user's code, which imports torch). The answer is cached for this
    process and its children (environment variable ``MEMSWEEP_USER_STEP_<sha1 of path and the
    functions>``): a sweep pays it once.

    Args:
        workload: the spec's validated user workload (``path`` and the functions' descriptions).
        timeout: seconds for the worker.

    Raises:
        SpecError: field ``workload.<fn>._target_`` (not importable, no such callable, a class
            where a factory is expected, a call that does not bind) or ``workload.train_step``
            (not callable as train_step(model, batch, optimizer)), or the worker gave no answer.
    """
    import hashlib

    fns = ("model", "inputs", "loss", "optimizer", "train_step")
    arg = json.dumps({"path": workload.get("path"), **{k: workload.get(k) for k in fns}}, sort_keys=True)

    def check() -> dict:
        try:
            return ask_worker("--check-user", arg, timeout=timeout)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            return {
                "field": "workload.model",
                "value": (workload.get("model") or {}).get("_target_"),
                "accepted": (f"functions the worker can import and check (no answer: {exc})"),
            }

    answer = _env_cached("MEMSWEEP_USER_STEP_" + hashlib.sha1(arg.encode()).hexdigest(), check)
    if not answer.get("ok"):
        raise SpecError(answer.get("field") or "workload.train_step", answer.get("value"), str(answer.get("accepted")))


def hf_count(workload: dict, timeout: float = 600) -> dict:
    """transformers' count of an ``hf`` workload's model (``python -m memsweep.worker --count-params``).

    The worker builds the model on the meta device (no memory, nothing downloaded), a few
    seconds for importing transformers; the answer is cached for this process and its children
    (environment variable ``MEMSWEEP_COUNT_<sha1 of config and overrides>``), as the device
    probe is, so a sweep pays it once per distinct model.

    Args:
        workload: the spec's validated hf workload (``config``, or without one the ``pretrained``
            checkpoint directory whose config.json it holds; ``overrides``).
        timeout: seconds for the worker.

    Returns:
        the count (``worker.count.count_config``'s dict), or ``{"error": ...}``.
    """
    import hashlib

    config = workload["config"] if workload["config"] is not None else workload.get("pretrained")  # its config.json
    arg = json.dumps({"config": config, "overrides": workload.get("overrides") or {}}, sort_keys=True)

    def count() -> dict:
        try:
            answer = ask_worker("--count-params", arg, timeout=timeout)
        except (RuntimeError, OSError) as exc:
            return {"error": f"the count worker gave no answer: {exc}"}
        except subprocess.TimeoutExpired:
            return {"error": f"the count worker ran past {timeout:g} s (killed)"}
        return (answer.get("counts") or [{"error": answer.get("error") or "no count"}])[0]

    return _env_cached("MEMSWEEP_COUNT_" + hashlib.sha1(arg.encode()).hexdigest(), count)
