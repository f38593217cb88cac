"""Runs to the fastest setting inside the margin: memsweep's throughput search
(``sweeper.search.throughput``) next to DeepSpeed's autotuner micro-batch search and an
exhaustive sweep, replayed on the same synthetic throughput curves (no processes: each "run" is
one call of a curve that returns a noisy median samples/s and its MAD/median).

Curves, on lattices of N = 64, 256, 1024 and 4096 values (1..N, the margin's edge at N):

* ``plateau``: f(x) = x / (x + K), K = N/256 .. N/16 (a saturating step time);
* ``rise-fall N/2``: log-normal in x, peak at N/2 times 2^-0.4, 1 or 2^0.3, f(2 peak) = 0.63 f(peak)
  (vLLM's 19K -> 12K tokens/s from batch 512 to 1024) or 0.8; ``rise-fall N/8``: the same shapes
  peaking at N/8 (times the same factors);
* ``rise-cliff``: f(x) = x / (x + N/64) / (1 + (x / D)^4), D = N/8, N/2 * 2^-0.4 or N/2 * 2^0.3: a
  plateau, then a steep fall (not the search's model: log f is no parabola in log x);
* ``monotone``: f(x) = x^p, p = 0.2 .. 1 (still rising at the margin's edge).

Noise: every run is the median of 10 samples f * (1 + 1.4826 * nu * z), z standard normal, with
nu = 1 %, 2 % or 5 % (so the run's MAD/median is about nu); the run reports both.

DeepSpeed (``autotuning/autotuner.py``, reimplemented from its code, gradient accumulation 1):
``get_min_max_micro_batch_size``'s binary search from the smallest micro-batch up to the
largest (here the margin's edge, so no run runs out of memory), stopping when a run's throughput
improves on the previous one by less than 5 % (METRIC_PERCENT_DIFF_CONST); then
``get_tuning_micro_batch_size_list`` (3 sizes from max/2 to max, those changing the gradient
accumulation kept) and the walk down from max in strides of a third while each step improves by
more than 5 %; the answer is the fastest run. Exhaustive: every value once, the fastest run.

Printed per curve family: the median runs, the share of answers within 2 % of the true best, the
median runs to an answer within 2 % (a search that stops on an answer further off never gets
there), and the ratios of memsweep's runs to within 2 % to the others'. Goal: fewer runs to within
2 % than DeepSpeed's method on every family, with 90 % of memsweep's answers within 2 %.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memsweep.sweeper.search import Lattice  # noqa: E402
from memsweep.sweeper.search.throughput import search_throughput  # noqa: E402

SIZES = (64, 256, 1024, 4096)
NOISES = (0.01, 0.02, 0.05)
SAMPLES = 10
METRIC_PERCENT_DIFF_CONST = 0.05  # DeepSpeed autotuning/constants.py
NUM_TUNING_MICRO_BATCH_SIZES = 3  # DeepSpeed's default num_tuning_micro_batch_sizes
TRIALS = 6  # per (curve parameter, size, noise)

Curve = Callable[[int], float]


def lognormal(peak: float, drop_at_double: float = 0.63) -> Curve:
    """exp(-(ln x - ln peak)^2 / (2 s^2)), s such that f(2 peak) = drop_at_double * f(peak)."""
    s2 = math.log(2) ** 2 / (2 * -math.log(drop_at_double))
    return lambda x: 1000.0 * math.exp(-((math.log(x) - math.log(peak)) ** 2) / (2 * s2))


def plateau(k: float) -> Curve:
    """x / (x + k): a saturating step time."""
    return lambda x: 1000.0 * x / (x + k)


def cliff(k: float, d: float) -> Curve:
    """x / (x + k) / (1 + (x / d)^4): a plateau, then a steep fall."""
    return lambda x: 1000.0 * x / (x + k) / (1 + (x / d) ** 4)


def power(p: float) -> Curve:
    """x^p: still rising at the top."""
    return lambda x: 1000.0 * x**p


def families(n: int) -> dict[str, list[Curve]]:
    """Curve family -> its curves on 1..n."""
    return {
        "plateau": [plateau(n / r) for r in (256, 64, 16)],
        "rise-fall N/2": [lognormal(n / 2 * 2**u, d) for u in (-0.4, 0, 0.3) for d in (0.63, 0.8)],
        "rise-fall N/8": [lognormal(n / 8 * 2**u, d) for u in (-0.4, 0, 0.3) for d in (0.63, 0.8)],
        "rise-cliff": [cliff(n / 64, n / 2 * 2**u) for u in (-2, -0.4, 0.3)],
        "monotone": [power(p) for p in (0.2, 0.5, 1.0)],
    }


def noisy(curve: Curve, nu: float, rng: random.Random) -> Callable[[int], tuple[float, float]]:
    """One run: the median of SAMPLES noisy samples and their MAD/median."""

    def run(x: int) -> tuple[float, float]:
        f = curve(x)
        samples = [f * (1 + 1.4826 * nu * rng.gauss(0, 1)) for _ in range(SAMPLES)]
        med = statistics.median(samples)
        mad = statistics.median(abs(s - med) for s in samples)
        return med, mad / med

    return run


def deepspeed(measure: Callable[[int], tuple[float, float]], lo: int, hi: int) -> tuple[int, int]:
    """DeepSpeed's micro-batch tuning between ``lo`` and ``hi`` (both fit): (answer, runs)."""
    runs: dict[int, float] = {}

    def run(m: int) -> float:
        if m not in runs:
            runs[m] = measure(m)[0]
        return runs[m]

    prev = run(lo)  # the smallest micro-batch
    low, high = lo, hi
    while low <= high:  # get_min_max_micro_batch_size: the binary search with its plateau stop
        mid = (low + high) // 2
        metric = run(mid)
        low = mid + 1
        if prev and (metric - prev) / prev < METRIC_PERCENT_DIFF_CONST:
            break
        prev = metric
    top = low - 1
    small = max(lo, top // 2)  # get_tuning_micro_batch_size_list
    stride = max(1, (top - small) // NUM_TUNING_MICRO_BATCH_SIZES)
    listed = [m for m in range(small, top, stride) if top // m != 1] + [top]
    for m in listed:
        run(m)
    same_gas = listed[-2] + 1 if len(listed) > 1 else small  # the walk below max with the same accumulation
    best_metric = run(top)
    stride = max(1, (top - same_gas) // 3)
    for m in reversed(range(same_gas, top, stride)):
        metric = run(m)
        if metric > best_metric * (1 + METRIC_PERCENT_DIFF_CONST):
            best_metric = metric
        else:
            break
    return max(runs, key=lambda m: runs[m]), len(runs)


def exhaustive(measure: Callable[[int], tuple[float, float]], lo: int, hi: int) -> tuple[int, int]:
    """Every value once: (the fastest run, runs)."""
    got = {m: measure(m)[0] for m in range(lo, hi + 1)}
    return max(got, key=lambda m: got[m]), len(got)


def memsweep(measure: Callable[[int], tuple[float, float]], lo: int, hi: int) -> tuple[int, int]:
    """memsweep's throughput search: (answer, runs)."""
    answer = search_throughput(Lattice(lo, hi, 1), hi, measure)
    assert answer.best is not None
    return answer.best, answer.runs


def words(x: float) -> str:
    """A median run count, 'never' for inf."""
    return "never" if math.isinf(x) else f"{x:.0f}"


def ratio(a: float, b: float) -> str:
    """a / b, '0' when b is inf, 'n/a' when a is."""
    return "n/a" if math.isinf(a) else "0" if math.isinf(b) else f"{a / b:.3f}"


METHODS = {"memsweep": memsweep, "deepspeed": deepspeed, "exhaustive": exhaustive}


def main() -> int:
    rng = random.Random(0)
    table: dict[str, dict[str, list[tuple[int, bool]]]] = {}
    for n in SIZES:
        for family, curves in families(n).items():
            for curve in curves:
                truth = max(curve(x) for x in range(1, n + 1))
                for nu in NOISES:
                    for _ in range(TRIALS):
                        for name, method in METHODS.items():
                            best, runs = method(noisy(curve, nu, rng), 1, n)
                            table.setdefault(family, {}).setdefault(name, []).append(
                                (runs, curve(best) >= 0.98 * truth)
                            )
    print(f"runs to the fastest value inside the margin (lattices of {SIZES} values, noise {NOISES}, median of")
    print(f"{SAMPLES} samples a run); 'within 2%': share of answers whose true throughput is within 2 % of the best\n")
    head = f"{'curve':<15}" + "".join(f"{m + ' runs':>17}{'within 2%':>10}{'to 2%':>7}" for m in METHODS)
    print(head + f"{'vs deepspeed':>14}{'vs exhaustive':>15}")
    goal = True
    for family, by in table.items():
        med = {m: statistics.median(r for r, _ in by[m]) for m in METHODS}
        hit = {m: sum(h for _, h in by[m]) / len(by[m]) for m in METHODS}
        # runs to a setting within 2 %: a search that stops short of it never gets there (inf)
        to = {m: statistics.median(r if h else math.inf for r, h in by[m]) for m in METHODS}
        line = f"{family:<15}" + "".join(f"{med[m]:>17.1f}{hit[m]:>10.0%}{words(to[m]):>7}" for m in METHODS)
        print(line + f"{ratio(to['memsweep'], to['deepspeed']):>14}{ratio(to['memsweep'], to['exhaustive']):>15}")
        goal = goal and to["memsweep"] < to["deepspeed"] and hit["memsweep"] >= 0.9
    print("\n'to 2%': median runs to an answer within 2 % of the true best, 'never' when more than half of")
    print("the searches stop on an answer further off; ratios: memsweep's 'to 2%' over the other's (0: the")
    print("other never gets there)")
    verdict = "met" if goal else "NOT met"
    print(f"goal (fewer runs to within 2 % than deepspeed, 90 % of answers within 2 %, every curve): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
