"""memsweep worker: the isolated process that measures one condition.

Run as ``python -m worker SPEC.json``. Imports torch and the standard library only; this
package's ``__init__`` imports nothing so that ``worker.records`` (the shared contract) can
be imported by the sweeper and the analysis without pulling in torch.
"""
