"""Metrics against brute force, published reference values and scipy."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rnr_interp.metrics import (
    audit_summary,
    bootstrap_ci,
    discordant_counts,
    gap_recovery,
    mcnemar,
    mean_pass_at_k,
    paired_diff_ci,
    pass_at_k,
    pass_at_k_curve,
    question_scores,
    wilson_interval,
)

SMALL_NCK = [(n, c, k) for n in range(1, 11) for c in range(n + 1) for k in range(1, n + 1)]


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_brute_force() -> None:
    for n, c, k in SMALL_NCK:
        assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


@pytest.mark.parametrize("n", [1, 5, 10, 64])
def test_pass_at_k_curve_properties(n: int) -> None:
    ks = np.arange(1, n + 1)
    for c in range(n + 1):
        curve = pass_at_k_curve(n, c, ks)
        assert np.all(np.diff(curve) >= -1e-15), "pass@k must not decrease in k"
        assert curve[-1] == float(c > 0)  # pass@n: any correct sample at all
        assert curve[0] == pytest.approx(c / n, abs=1e-15)


@pytest.mark.parametrize("n,c,k", [(1000, 3, 500), (1000, 997, 2), (5000, 2500, 2500), (4000, 1, 1)])
def test_pass_at_k_stable_for_large_n(n: int, c: int, k: int) -> None:
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))  # exact big-integer reference
    value = pass_at_k(n, c, k)
    assert math.isfinite(value)
    assert value == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_rejects_impossible_inputs() -> None:
    for n, c, k in [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_mean_pass_at_k_is_the_mean_of_question_curves() -> None:
    rng = np.random.default_rng(0)
    ns = rng.choice([8, 10], size=50)
    cs = rng.integers(0, ns + 1)
    ks = [1, 2, 4, 8]
    direct = np.mean([pass_at_k_curve(n, c, ks) for n, c in zip(ns, cs)], axis=0)
    np.testing.assert_allclose(mean_pass_at_k(ns, cs, ks), direct, rtol=1e-12)


# -- intervals and tests ----------------------------------------------------------


def wilson_by_hand(x: int, n: int, z: float) -> tuple[float, float]:
    # statsmodels' proportion_confint(method="wilson") formula, written out
    p = x / n
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z / (1 + z**2 / n) * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return centre - half, centre + half


@pytest.mark.parametrize(
    "x,n,ref",
    [(0, 10, (0.0, 0.2775328)), (5, 10, (0.2365931, 0.7634069)), (10, 10, (0.7224672, 1.0))],
)
def test_wilson_known_values(x: int, n: int, ref: tuple[float, float]) -> None:
    lo, hi = wilson_interval(x, n, 0.95)
    assert (lo, hi) == pytest.approx(ref, abs=1e-7)
    assert (lo, hi) == pytest.approx(wilson_by_hand(x, n, stats.norm.ppf(0.975)), abs=1e-12)
    assert wilson_interval(x, n, 0.99)[1] >= hi  # wider at a higher level


def test_wilson_empty_is_nan() -> None:
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    assert [wilson_interval(0, n)[0] for n in (1, 3, 7)] == [0.0] * 3  # exact, no float round-off
    assert [wilson_interval(n, n)[1] for n in (1, 3, 7)] == [1.0] * 3


@pytest.mark.parametrize("b,c", [(0, 0), (0, 1), (1, 0), (3, 3), (2, 9), (12, 0), (7, 17)])
def test_mcnemar_exact_matches_binomtest(b: int, c: int) -> None:
    res = mcnemar(b, c)
    assert res["method"] == "exact" and (res["b"], res["c"]) == (b, c)
    ref = 1.0 if b + c == 0 else stats.binomtest(b, b + c, 0.5).pvalue
    assert res["p_value"] == pytest.approx(ref, rel=1e-12)


def test_mcnemar_chi_square_for_large_counts() -> None:
    res = mcnemar(20, 40)
    assert res["method"] == "chi2"
    assert res["statistic"] == pytest.approx(19**2 / 60)
    assert res["p_value"] == pytest.approx(stats.chi2.sf(19**2 / 60, 1))
    # Close to the exact test once b + c is large.
    assert res["p_value"] == pytest.approx(stats.binomtest(20, 60, 0.5).pvalue, rel=0.15)
    assert mcnemar(30, 30)["p_value"] == 1.0


def test_discordant_counts() -> None:
    before = [1, 1, 0, 0, 1, 0]
    after = [1, 0, 1, 1, 1, 0]
    assert discordant_counts(before, after) == (1, 2)
    with pytest.raises(ValueError):
        discordant_counts([0, 2], [0, 1])


def cavo_2012() -> tuple[np.ndarray, np.ndarray]:
    """Fagerland, Lydersen & Laake, paired 2x2 example (Cavo et al. 2012):
    59 both, 6 before only, 16 after only, 80 neither."""
    before = np.r_[np.ones(65), np.zeros(96)]
    after = np.r_[np.ones(59), np.zeros(6), np.ones(16), np.zeros(80)]
    return before, after


def test_newcombe_paired_reference_values() -> None:
    # Their Newcombe square-and-add interval for before - after: -0.0621 (-0.1186 to -0.0046).
    before, after = cavo_2012()
    assert paired_diff_ci(before, after) == pytest.approx((0.0046, 0.1186), abs=5e-5)
    assert paired_diff_ci(after, before) == pytest.approx((-0.1186, -0.0046), abs=5e-5)


def test_paired_bootstrap_is_seeded_and_paired() -> None:
    before, after = cavo_2012()
    a = paired_diff_ci(before, after, method="bootstrap", seed=3)
    assert a == paired_diff_ci(before, after, method="bootstrap", seed=3)
    assert a[0] < 10 / 161 < a[1]
    # Identical paired outcomes differ by exactly 0 on every resample.
    assert paired_diff_ci(before, before, method="bootstrap") == (0.0, 0.0)


def test_bootstrap_ci_statistic_and_columns() -> None:
    x = np.arange(100, dtype=float)
    lo, hi = bootstrap_ci(x, seed=1)
    assert lo < x.mean() < hi
    assert bootstrap_ci(x, np.median, n_boot=500, seed=1)[0] < np.median(x)
    los, his = bootstrap_ci(np.column_stack([x, 2 * x]), seed=1)
    np.testing.assert_allclose(los[1], 2 * los[0])
    np.testing.assert_allclose(his[1], 2 * his[0])


def test_gap_recovery() -> None:
    assert gap_recovery(0.6, 0.5, 0.9) == pytest.approx(0.25)
    assert gap_recovery(0.9, 0.5, 0.9) == 1.0
    assert gap_recovery(0.5, 0.5, 0.9) == 0.0
    assert gap_recovery(0.4, 0.5, 0.9) == pytest.approx(-0.25)
    assert math.isnan(gap_recovery(0.7, 0.5, 0.5))


# -- per-question scores and the audit summary --------------------------------------

# question -> (deployed correct, probe candidates' correctness by candidate index)
TABLE = {
    "q1": (True, [False, True, True, False]),
    "q2": (False, [False, False, True, False]),
    "q3": (False, [False, False, False, False]),
    "q4": (True, [False, False, False, False]),
    "q5": (False, [True, False, False, False]),
    "q6": (False, [False, False, False, True]),
    "q7": (True, [True, True, True, True]),
}


def records_from(table: dict[str, tuple[bool, list[bool]]], probe: str = "temperature") -> pd.DataFrame:
    rows = []
    for q, (deployed, samples) in table.items():
        rows.append({"question_id": q, "probe": "deployed", "candidate": 0, "correct": deployed})
        # written in reverse so that "first k" must come from the candidate index
        for i in reversed(range(len(samples))):
            rows.append({"question_id": q, "probe": probe, "candidate": i, "correct": samples[i]})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("k", [None, 1, 2, 4])
def test_question_scores(k: int | None) -> None:
    scores = question_scores(records_from(TABLE), "temperature", k)
    assert list(scores.index) == list(TABLE)
    for q, (deployed, samples) in TABLE.items():
        row = scores.loc[q]
        assert row["d"] == deployed and row["n"] == 4 and row["c"] == sum(samples)
        assert row["o"] == any(samples[: k or 4])


@pytest.mark.parametrize("k", [None, 2])
def test_audit_summary_wilson_equals_direct(k: int | None) -> None:
    s = audit_summary(records_from(TABLE), "temperature", k=k)
    d = np.array([t[0] for t in TABLE.values()], dtype=float)
    o = np.array([any(t[1][: k or 4]) for t in TABLE.values()], dtype=float)
    assert s["n_questions"] == 7 and s["k"] == (k or 4)
    assert s["D"] == pytest.approx(d.mean()) and s["O_K"] == pytest.approx(o.mean())
    assert s["gap"] == pytest.approx(o.mean() - d.mean())
    assert s["D_ci"] == pytest.approx(wilson_by_hand(int(d.sum()), 7, stats.norm.ppf(0.975)), abs=1e-12)
    assert s["O_K_ci"] == pytest.approx(list(wilson_interval(o.sum(), 7)))
    assert s["gap_ci"] == pytest.approx(list(paired_diff_ci(d, o)))
    for key in ("D", "O_K", "gap"):
        lo, hi = s[f"{key}_ci"]
        assert lo <= s[key] <= hi


def test_audit_summary_bootstrap() -> None:
    recs = records_from(TABLE)
    s = audit_summary(recs, "temperature", ci="bootstrap", n_boot=500, seed=7)
    assert s == audit_summary(recs, "temperature", ci="bootstrap", n_boot=500, seed=7)
    for key in ("D", "O_K", "gap"):
        lo, hi = s[f"{key}_ci"]
        assert lo <= s[key] <= hi
    # Paired: when the probe always agrees with the deployed answer the gap is exactly 0.
    same = {q: (d, [d] * 3) for q, (d, _) in TABLE.items()}
    assert audit_summary(records_from(same), "temperature", ci="bootstrap")["gap_ci"] == [0.0, 0.0]


def test_question_scores_refuses_incomplete_records() -> None:
    recs = records_from(TABLE)
    no_deployed = recs[~((recs.question_id == "q3") & (recs.probe == "deployed"))]
    with pytest.raises(ValueError, match="without a deployed row: q3"):
        question_scores(no_deployed, "temperature")
    with pytest.raises(ValueError, match="several deployed rows"):
        question_scores(pd.concat([recs, recs[recs.probe == "deployed"]]), "temperature")
    with pytest.raises(ValueError, match="fewer"):
        question_scores(recs, "temperature", k=5)
    with pytest.raises(ValueError, match="no rows for probe 'mcts'"):
        question_scores(recs, "mcts")
    with pytest.raises(ValueError, match="without 'temperature' rows: q8"):
        extra = pd.DataFrame([{"question_id": "q8", "probe": "deployed", "candidate": 0, "correct": True}])
        question_scores(pd.concat([recs, extra]), "temperature")


# -- deployable votes ----------------------------------------------------------------

from collections import Counter  # noqa: E402
from itertools import combinations, permutations  # noqa: E402

from rnr_interp.metrics import gap_recovery_ci, oracle_curve_after_first, selection_summary, vote_curve  # noqa: E402


def _vote(order, answers, right):
    """Majority over `order` (indices), ties to the answer seen first; None: abstain."""
    seen = [answers[i] for i in order if answers[i] is not None]
    if not seen:
        return False
    counts = Counter(seen)
    top = max(counts.values())
    return right[next(a for a in seen if counts[a] == top)]


def test_vote_curve_matches_exhaustive_expectation_over_subsets_and_orders():
    answers = ["A", "B", "B", None, "A", "C"]
    correct = [False, True, True, False, False, False]
    right = {"A": False, "B": True, "C": False}
    est = vote_curve(answers, correct, range(1, 7), n_orderings=4000, seed=1)
    for k in range(1, 6):
        exact = np.mean([_vote(p, answers, right) for s in combinations(range(6), k) for p in permutations(s)])
        assert est[k - 1] == pytest.approx(exact, abs=0.03), k
    # k = n: the vote over all candidates in record order (A and B tie 2-2, A first).
    assert est[-1] == 0.0
    assert vote_curve(["B", "A", "A", "B"], [True, False, False, True], [4])[0] == 1.0


def test_vote_curve_keeps_the_fixed_first_candidate_and_weights_votes():
    # The full path answers A; with it always in, a single other vote ties and A wins.
    assert vote_curve(["A", "B", "B", "B"], [False, True, True, True], [1, 2, 3], fixed_first=1, seed=0).tolist() == [0.0, 0.0, 1.0]
    # One confident vote outweighs two unsure ones; unweighted it loses.
    answers, correct = ["A", "B", "B"], [True, False, False]
    assert vote_curve(answers, correct, [3], weights=[0.9, 0.2, 0.2])[0] == 1.0
    assert vote_curve(answers, correct, [3])[0] == 0.0
    # No candidate answers: an abstention, graded wrong.
    assert vote_curve([None, None], [False, False], [1, 2]).tolist() == [0.0, 0.0]


def test_oracle_curve_after_first_is_pass_at_k_of_the_rest():
    assert oracle_curve_after_first(True, 5, 0, [1, 3]).tolist() == [1.0, 1.0]
    curve = oracle_curve_after_first(False, 4, 1, [1, 2, 3, 5])
    assert curve.tolist() == pytest.approx([0.0, 0.25, 0.5, 1.0])


def test_selection_summary_is_paired_and_consistent():
    d = np.array([0, 1, 0, 0, 1, 0, 0, 0] * 5)
    o = np.array([1, 1, 1, 0, 1, 1, 0, 1] * 5)
    s = np.array([1, 1, 0, 0, 1, 0, 0, 0] * 5)
    out = selection_summary(d, o, s)
    assert out["selection_gap"] == pytest.approx(o.mean() - s.mean())
    assert out["gap_recovery"] == pytest.approx((s.mean() - d.mean()) / (o.mean() - d.mean()))
    for key in ("accuracy", "selection_gap", "minus_deployed", "gap_recovery"):
        lo, hi = out[f"{key}_ci"]
        assert lo <= out[key] <= hi, key
    # Nothing to recover: no interval rather than a made-up one.
    assert np.isnan(gap_recovery_ci(d, d, s)).all()
