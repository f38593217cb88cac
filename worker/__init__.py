"""memsweep worker: the isolated process that measures one condition.

Run as ``python -m memsweep.worker SPEC.json``. Imports torch, the standard library and the contract
(``conf.contract``) only; nothing outside the worker imports it (the sweeper starts it as a
process). This package's ``__init__`` imports nothing.
"""
