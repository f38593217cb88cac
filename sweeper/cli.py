"""The ``memsweep`` command.

    memsweep run [OVERRIDES]        measure one condition (Hydra run)
    memsweep sweep [OVERRIDES]      one-variable-at-a-time sweep (Hydra multirun), then analyze
    memsweep analyze DIR [DIR ...]  Parquet tables and the frontier of sweep directories
    memsweep report DIR [DIR ...] [--out DIR] [--margin 10%|0.1|2GiB]
                                    report.md + self-contained report.html: frontier, margin,
                                    chosen setting, phases, estimate, other cards
    memsweep estimate [OPTIONS]     calculated memory of a load (weights, training state, KV cache...)
    memsweep predict [OVERRIDES] capacity=SIZE [--axis batch]
                                    predicted edge of an axis from dry runs (fake tensors, no device)
    memsweep env [--device auto|cpu|cuda:N] [--json]
                                    the environment report (device, driver, Python, PyTorch, CUDA/HIP,
                                    allocator settings); exit 2 when PyTorch or the device is missing

OVERRIDES use Hydra's syntax: ``batch=16 capacity=2GiB sweep=ovat hydra/launcher=joblib``.

Exit status of ``memsweep run``: 0 ok, 3 out of memory, 4 error, 6 crash, 7 timeout (the run's
outcome), 2 bad input (nothing ran). ``memsweep sweep``: 0 when the sweep ran (its OOMs are
its data), 2 bad input, 130 interrupted (resumable).
"""

from __future__ import annotations

import sys
from pathlib import Path

from conf.contract import EXIT_BAD_INPUT, EXIT_INTERRUPTED, RUN_EXIT, bytes_text, validate_device

USAGE = __doc__


def _hydra_main(argv: list[str], multirun: bool) -> int:
    import hydra
    from omegaconf import DictConfig

    from .job import run_condition
    from .process import RunDirError, check_run_dir_free

    new_run_dir = True  # the default run directory is a new, timestamped one
    if not multirun:
        for arg in argv:  # refuse before Hydra writes anything into an existing run directory
            if arg.startswith("hydra.run.dir="):
                run_dir = Path(arg.split("=", 1)[1])
                new_run_dir = not run_dir.exists()
                try:
                    check_run_dir_free(run_dir)
                except RunDirError as exc:
                    print(f"memsweep run: {exc}", file=sys.stderr)
                    return 1

    results: list[dict] = []

    @hydra.main(version_base="1.3", config_path="pkg://conf", config_name="config")
    def _main(cfg: DictConfig) -> dict:
        result = run_condition(cfg, new_run_dir=new_run_dir)
        results.append(result)
        return result

    sys.argv = ["memsweep"] + (["--multirun"] if multirun else []) + argv
    try:
        _main()
    except SystemExit as exc:  # Hydra exits 1 after printing a job's error
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except KeyboardInterrupt:
        print("memsweep: interrupted; finished runs are kept: the same command with the same "
              "hydra.sweep.dir=... resumes without running them again" if multirun else
              "memsweep: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not multirun and results:  # one run: its outcome is the exit status (a sweep's OOMs are its data)
        return RUN_EXIT.get(results[-1].get("outcome"), 1)
    return 0


def env_command(argv: list[str]) -> int:
    """``memsweep env``: asks a worker process (this one never imports torch) for the report."""
    import argparse
    import json

    from .spec import ask_worker

    parser = argparse.ArgumentParser(prog="memsweep env", description=env_command.__doc__)
    parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        validate_device(args.device)
    except ValueError as exc:
        print(f"memsweep env: {exc}", file=sys.stderr)
        return 2
    try:
        info = ask_worker("--env", args.device)
    except RuntimeError as exc:
        print(f"memsweep env: the worker could not report ({exc})", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print(f"device: {info.get('device', args.device)}  available: {info.get('available')}"
              + (f"  ({info['reason']})" if info.get("reason") else ""))
        for key, value in (info.get("environment") or {}).items():
            print(f"  {key}: {value}")
        if info.get("total_memory") is not None:
            print(f"  total_memory: {bytes_text(info['total_memory'])}")
    return 0 if info.get("available") else 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        return _hydra_main(rest, multirun=False)
    if command == "sweep":
        return _hydra_main(rest, multirun=True)
    if command == "analyze":
        from analysis.cli import main as analyze_main

        return analyze_main(rest)
    if command == "report":
        from analysis.report import main as report_main

        return report_main(rest)
    if command == "estimate":
        from analysis.estimate_cli import main as estimate_main
        return estimate_main(rest)
    if command == "predict":
        from .predict import predict

        return predict(rest)
    if command == "env":
        return env_command(rest)
    print(f"memsweep: unknown command {command!r}; expected one of run, sweep, analyze, report, estimate, "
          f"predict, env\n{USAGE}",
          file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
