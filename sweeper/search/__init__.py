"""The adaptive frontier search: which values to probe next, and what the probes say.

Pure logic, no processes, no Hydra, no torch: ``FrontierSearch`` proposes values of one
axis (batch, context or width) and is told each probe's outcome and peak; the Hydra
sweeper (``sweeper.frontier_sweeper``) runs the probes as fresh worker processes,
``memsweep predict`` (``sweeper.predict``) answers them with dry runs, the tests and
``make bench`` from scripted or synthetic oracles (``run_search``).

Modules, one job each:

* ``lattice``: the values an axis may take (``Lattice``), a probe (``Probe``), what a run said
  about its value (``Reading``), a strategy's
  proposal (``Pick``), the axes and outcomes;
* ``peaks``: the model of the peak (``fit_peak``, ``peak_band``) on the shared fit of
  ``analysis.fit``;
* ``moves``: the moves a round is made of (growth, the split points of a bracket, fill,
  the pair around a predicted edge);
* ``strategies``: which values a round proposes (``model_round``, ``bisect_round``...);
* ``bracket``: the model's round once an OOM said what it held and asked
  (``bracket_round``) and the candidate it probes next (``next_offset``);
* ``state``: the search itself (``FrontierSearch``: bracket, propose, observe, result) and
  ``run_search``.

Vocabulary (design.md): on the lattice of values ``lower' <= v <= upper'`` that are
multiples of ``multiple_of`` (``lower'``/``upper'`` are lower/upper rounded inwards),
``max_ok`` is the largest value that ran ok, ``min_oom`` the smallest that ran out of
memory; the edge is exact when they are neighbours on the lattice
(``min_oom - max_ok == multiple_of``). The search keeps a bracket ``(lo, hi)``:
``hi`` = the smallest OOM so far, ``lo`` = the largest success below it.

Strategies (one small function each, in the spirit of Lightning's tuner):

* ``bisect``: grow geometrically (x2) from ``lower'`` until the first OOM or ``upper'``,
  then bisect between the last success (lo) and the first OOM (hi).
* ``model`` (default): after the first success, jump to a value that must still fit if
  the peak is at most proportional to the axis (to its square for context and width),
  which gives a second, well-separated point. With two or more successes, fit the peak
  against the axis by least squares (affine; for context and width a quadratic term is
  allowed, since attention scores grow with the square of the context and the mlp's
  weights with the square of its width) and bound it by a band (the peaks' resolution,
  e.g. 2 MiB segments of the CUDA caching allocator, or the fit's residual, widened by the
  slope error over the span of the successes; ``peak_band``). Where the band crosses the
  capacity recorded by the worker is where the edge must be: when that range holds one or
  two lattice values, probe just below and just above the central prediction; when it is
  wider, probe its geometric midpoint, which either fits (a far success: a much better
  fit) or halves the range. When the probes contradict the capacity (an OOM where even
  the pessimistic fit stays under it: something the counter does not see takes memory),
  step down from that OOM by growing steps (``GALLOP``), never below the bracket's
  midpoint. Two wrong predictions in a row force one bisection step. The search never
  ends on a prediction: only on a success next to an OOM.
  What the OOMs say (issue #16): an OOM that held A and asked R bounds the usable capacity
  to [A, A + R), the successes' peaks bound it from below (``FrontierSearch.usable``); when
  A + R is within the recorded capacity, the model solves for the edge against that bracket
  instead of the capacity (``bracket.bracket_round``): the lattice values between where the
  pessimistic fit reaches the floor and where the optimistic fit reaches the ceiling are the
  candidates; it bisects them, leaning to the likelier OOM (an OOM's A and A + R say more
  than a success's peak), and forces a bisection of the runs' bracket only when two rounds
  halved neither it nor the candidates.

With a ``seed`` (the edge a dry run predicts, ``memsweep predict``), the first probes are the
seed and its upper neighbour; when the prediction is right the exact edge takes two real
runs, otherwise the strategy goes on from the bracket they give.

With ``slots`` probes per round (a launcher running k jobs at once) a round proposes up
to k values: growth points, or the k points that split the bracket into k+1 parts, or
the model's pair plus split points.

Invariants (tested on random monotone oracles with hypothesis): ``max_ok`` is always a
value that ran ok, ``min_oom`` always a value that ran out of memory, and on a monotone
oracle the search ends exact, or with "edge not found below the upper bound" (``upper'`` fits), or
with "lower bound does not fit". An ``error``, ``crash`` or ``timeout`` stops the search
(``stopped_by``); it is never read as an OOM nor as a success. A success above an OOM is
flagged (``monotonic`` false), never smoothed away.
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
from .state import FrontierSearch, Oracle, SearchResult, run_search
from .strategies import STRATEGIES

__all__ = [
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
