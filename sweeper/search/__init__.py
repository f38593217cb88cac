"""The adaptive frontier search: which values of one axis to probe next, and what the probes say.

Pure logic, no processes, no Hydra, no torch: ``FrontierSearch`` proposes values of one axis
(batch, context or width) and is told each probe's outcome and peak; the Hydra sweeper
(``sweeper.frontier_sweeper``) runs the probes as fresh worker processes, ``memsweep predict``
(``sweeper.predict``) answers them with dry runs, tests and benchmarks with scripted oracles
(``run_search``).

Modules: ``lattice`` (values, probe, reading, pick), ``peaks`` (the fitted peak and its band),
``moves`` (growth, split, fill, pair, gallops), ``strategies`` (which values a round proposes),
``ramp`` and ``band`` (the model's round on linear and on quadratic axes), ``bracket`` (its round
once an OOM said what it held and asked), ``state`` (``FrontierSearch``, ``SearchResult``,
``run_search``). The reasoning and invariants are in docs/concepts/frontier.md.
"""

from .lattice import (
    OUTCOMES,
    QUADRATIC_AXES,
    SEARCH_AXES,
    STOP_OUTCOMES,
    Lattice,
    Pick,
    Probe,
    Reading,
    check_search_axis,
)
from .peaks import Band, fit_peak, peak_band
from .state import ERRORS_IN_A_ROW, FrontierSearch, Oracle, SearchResult, run_search
from .strategies import STRATEGIES

__all__ = [
    "ERRORS_IN_A_ROW",
    "OUTCOMES",
    "QUADRATIC_AXES",
    "SEARCH_AXES",
    "STOP_OUTCOMES",
    "STRATEGIES",
    "Band",
    "FrontierSearch",
    "Lattice",
    "Oracle",
    "Pick",
    "Probe",
    "Reading",
    "SearchResult",
    "check_search_axis",
    "fit_peak",
    "peak_band",
    "run_search",
]
