"""Question-level audit metrics: realized (D), reachable (O_K), their gap, and intervals.

For question i, d_i says whether the deployed (greedy) candidate is correct and
o_i(K) whether any of the first K probe candidates is. Aggregates are means over
questions: D = mean d_i, O_K = mean o_i(K), gap = O_K - D. The gap is a *paired*
difference (both numbers come from the same questions), so its interval must use the
pairing: an unpaired interval would be far too wide whenever d_i and o_i agree a lot.

Interval choices (documented here once):
- `ci="wilson"`: Wilson score intervals for D and O_K; for the gap, Newcombe's
  square-and-add interval for paired proportions (Newcombe 1998, method 10, with the
  continuity-corrected correlation estimate), which is built from those same two
  Wilson intervals, so the three intervals are mutually consistent and deterministic.
- `ci="bootstrap"`: one seeded paired bootstrap over questions (percentile method);
  D, O_K and the gap are computed on the same resamples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import stats

from rnr_interp.records import DEPLOYED

__all__ = [
    "DEPLOYED",
    "pass_at_k",
    "pass_at_k_curve",
    "mean_pass_at_k",
    "question_scores",
    "audit_summary",
    "wilson_interval",
    "bootstrap_ci",
    "paired_diff_ci",
    "discordant_counts",
    "mcnemar",
    "gap_recovery",
    "proportion",
    "unparsed_rate",
    "chance_baselines",
    "guess_gold_share",
    "answer_changes",
    "gap_recovery_ci",
    "oracle_curve_after_first",
    "selection_summary",
    "vote_curve",
    "vote_matrix",
    "PaperEffect",
    "REPAIR_EFFECT",
    "DAMAGE_EFFECT",
    "RESCUE_EFFECT",
    "INDUCTION_EFFECT",
    "MIN_POWER",
    "wilson_power",
    "power_entry",
]


# -- pass@k -------------------------------------------------------------------


def _check_nck(n: int, c: int, ks: np.ndarray) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if ks.size and (ks.min() < 1 or ks.max() > n):
        raise ValueError(f"pass@k needs 1 <= k <= n={n}, got k in {ks.tolist()}")


def pass_at_k_curve(n: int, c: int, ks: ArrayLike) -> np.ndarray:
    """Unbiased pass@k, 1 - C(n-c, k) / C(n, k), for each k in `ks`.

    Uses the product form 1 - prod_{i=n-c+1}^{n} (1 - k/i), summed in log space
    (log1p) so that neither binomial coefficient is ever formed: C(1000, 500) alone
    overflows a float.
    """
    ks_arr = np.atleast_1d(np.asarray(ks, dtype=np.int64))
    n, c = int(n), int(c)
    _check_nck(n, c, ks_arr)
    out = np.ones(ks_arr.shape, dtype=float)
    # When k > n - c every k-subset contains a correct sample: C(n-c, k) = 0.
    some_miss = ks_arr <= n - c
    if c == 0:
        out[:] = 0.0
    elif some_miss.any():
        i = np.arange(n - c + 1, n + 1, dtype=float)
        log_miss = np.log1p(-ks_arr[some_miss, None] / i[None, :]).sum(axis=1)
        out[some_miss] = -np.expm1(log_miss)  # 1 - exp(x), accurate when x is tiny
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one question with n samples of which c are correct."""
    return float(pass_at_k_curve(n, c, [k])[0])


def mean_pass_at_k(ns: ArrayLike, cs: ArrayLike, ks: ArrayLike) -> np.ndarray:
    """Mean pass@k curve over questions with per-question sample counts n_i and
    correct counts c_i. Every k must be <= min n_i (pass@k is undefined beyond n)."""
    ns_arr = np.asarray(ns, dtype=np.int64).ravel()
    cs_arr = np.asarray(cs, dtype=np.int64).ravel()
    if ns_arr.shape != cs_arr.shape or ns_arr.size == 0:
        raise ValueError(f"need equally long, non-empty n and c, got {ns_arr.size} and {cs_arr.size}")
    # Questions share few distinct (n, c) pairs (n is usually constant), so each
    # curve is computed once and weighted by how many questions have it.
    pairs, counts = np.unique(np.stack([ns_arr, cs_arr], axis=1), axis=0, return_counts=True)
    curves = np.stack([pass_at_k_curve(n, c, ks) for n, c in pairs])
    return (counts[:, None] * curves).sum(axis=0) / counts.sum()


# -- per-question scores --------------------------------------------------------


def _require_columns(df: pd.DataFrame, cols: Sequence[str]) -> None:
    missing = [col for col in cols if col not in df.columns]
    if missing:
        raise ValueError(f"records lack columns {missing}")


def _some(ids: Any, limit: int = 5) -> str:
    ids = sorted(map(str, ids))
    more = f" (+{len(ids) - limit} more)" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def question_scores(records: pd.DataFrame, probe: str, k: int | None = None) -> pd.DataFrame:
    """One row per question (index `question_id`, in order of the deployed rows):
    `d` deployed correct, `c` correct probe samples, `n` probe samples, `o` any correct
    among the first k probe candidates by candidate index (all of them when k is None).

    Raises ValueError when the records are ambiguous or incomplete for this audit: a
    question with several deployed rows (filter to one run first), probe rows without a
    deployed row, a question without probe rows, duplicate candidate indices, or fewer
    than k probe samples. Silently scoring such questions would bias D or O_K.
    """
    _require_columns(records, ("question_id", "probe", "candidate", "correct"))
    if probe == DEPLOYED:
        raise ValueError("probe must be a probe, not the deployed candidate itself")
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1, got {k}")

    dep = records[records["probe"] == DEPLOYED]
    multi = dep["question_id"][dep["question_id"].duplicated()]
    if len(multi):
        raise ValueError(
            f"several deployed rows for questions {_some(set(multi))}; "
            "filter the records to one run/model before scoring"
        )
    d = dep.set_index("question_id")["correct"].astype(bool)

    rows = records[records["probe"] == probe]
    if rows.empty:
        present = sorted(set(records["probe"]) - {DEPLOYED})
        raise ValueError(f"no rows for probe {probe!r}; probes present: {present}")
    dup = rows.duplicated(["question_id", "candidate"])
    if dup.any():
        raise ValueError(
            f"probe {probe!r} repeats candidate indices for questions "
            f"{_some(set(rows.loc[dup, 'question_id']))}"
        )
    no_deployed = set(rows["question_id"]) - set(d.index)
    if no_deployed:
        raise ValueError(f"questions without a deployed row: {_some(no_deployed)}")
    no_probe = set(d.index) - set(rows["question_id"])
    if no_probe:
        raise ValueError(f"questions without {probe!r} rows: {_some(no_probe)}")

    rows = rows.sort_values(["question_id", "candidate"], kind="stable")
    correct = rows["correct"].astype(bool)
    by_q = correct.groupby(rows["question_id"])
    n = by_q.size()
    c = by_q.sum().astype(np.int64)
    if k is None:
        o = c > 0
    else:
        short = n[n < k]
        if len(short):
            raise ValueError(
                f"k={k} but questions {_some(short.index)} have fewer {probe!r} samples "
                f"(min {int(short.min())})"
            )
        first_k = rows.groupby("question_id").cumcount() < k
        o = correct[first_k].groupby(rows.loc[first_k, "question_id"]).any()
    out = pd.DataFrame({"d": d, "c": c, "n": n, "o": o}).loc[d.index]
    return out.astype({"d": bool, "c": np.int64, "n": np.int64, "o": bool})


# -- intervals and tests --------------------------------------------------------


def _z(level: float) -> float:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return float(stats.norm.ppf(0.5 + level / 2))


def wilson_interval(successes: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (nan, nan) when n == 0."""
    z = _z(level)
    if n == 0:
        return (math.nan, math.nan)
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # 0/n and n/n have exact bounds 0 and 1; centre - half leaves float round-off there.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return (lo, hi)


def _bootstrap_stats(
    values: np.ndarray,
    statistic: Callable[[np.ndarray], Any] | None,
    n_boot: int,
    seed: int,
) -> np.ndarray:
    """Statistic on n_boot resamples of the rows of `values` (rows resampled together,
    which is what makes a bootstrap of paired per-question data paired)."""
    n = len(values)
    rng = np.random.default_rng(seed)
    if statistic is not None:
        return np.stack([np.asarray(statistic(values[rng.integers(0, n, n)])) for _ in range(n_boot)])
    # Column means, vectorised; chunked so n_boot x n indices never need much memory.
    chunk = max(1, 4_000_000 // max(n, 1))
    parts = []
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_boot - start), n))
        parts.append(values[idx].mean(axis=1))
    return np.concatenate(parts)


def bootstrap_ci(
    values: ArrayLike,
    statistic: Callable[[np.ndarray], Any] | None = None,
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[Any, Any]:
    """Percentile bootstrap interval, seeded.

    `values` is (n,) or (n, m): rows are the resampled units (questions), resampled
    whole so columns stay paired. `statistic` maps a resampled array to a scalar or
    vector; None means column means (vectorised, fast). Returns (lo, hi): floats for a
    scalar statistic, arrays for a vector one.
    """
    _z(level)
    arr = np.asarray(values, dtype=float)
    if len(arr) == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    boot = _bootstrap_stats(arr, statistic, n_boot, seed)
    alpha = 1 - level
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2], axis=0)
    if np.ndim(lo) == 0:
        return (float(lo), float(hi))
    return (lo, hi)


def proportion(successes: int, n: int, level: float = 0.95) -> dict[str, Any]:
    """A rate on its own denominator with its Wilson interval, as summaries store it:
    {"rate", "ci", "k" (successes), "n"}; rate and interval NaN when n == 0."""
    lo, hi = wilson_interval(successes, n, level)
    return {"rate": successes / n if n else math.nan, "ci": [lo, hi], "k": int(successes), "n": int(n)}


@dataclass(frozen=True)
class PaperEffect:
    """A rate the paper reports and the threshold a finding judges it against:
    "at_least" claims (repair, steering) are reproduced when the whole Wilson interval
    is at or above `threshold`, "at_most" claims (damage) when it is at or below."""

    name: str
    paper_rate: float
    threshold: float
    side: Literal["at_least", "at_most"]
    paper: str  # where the paper's rate comes from, in words


#: the paper's weakest reported rate of each localisation claim (repair 67.6-92.0%,
#: damage 0-12%, steering -8v rescues 97.5%, +4v induces 95%) and the finding's threshold
#: ("most" repaired / flipped, "little" damage)
REPAIR_EFFECT = PaperEffect("repair", 0.676, 0.5, "at_least", "the paper's lowest repair rate, 67.6%")
DAMAGE_EFFECT = PaperEffect("damage", 0.12, 0.15, "at_most", "the paper's highest damage rate, 12%")
RESCUE_EFFECT = PaperEffect("rescue", 0.975, 0.5, "at_least", "the paper's -8v rescue, 97.5%")
INDUCTION_EFFECT = PaperEffect("induction", 0.95, 0.5, "at_least", "the paper's +4v induction, 95%")
#: below this power a verdict cannot tell "no effect" from "too few questions"
MIN_POWER = 0.8
POWER_TEST = ("exact binomial probability, at the paper's rate and this n, that the finding's rule (the whole 95% "
              "Wilson interval on the paper's side of the threshold) says 'reproduced'")


def wilson_power(effect: PaperEffect, n: int, level: float = 0.95) -> float:
    """Probability that `n` questions with true rate `effect.paper_rate` give a Wilson
    interval wholly on the paper's side of `effect.threshold` (the findings' rule for
    "reproduced"): the sum of the binomial probabilities of the counts that pass. NaN
    for n == 0."""
    if n <= 0:
        return math.nan
    passing = [k for k in range(n + 1)
               if (wilson_interval(k, n, level)[0] >= effect.threshold if effect.side == "at_least"
                   else wilson_interval(k, n, level)[1] <= effect.threshold)]
    return float(stats.binom.pmf(passing, n, effect.paper_rate).sum()) if passing else 0.0


def power_entry(effect: PaperEffect, n: int, level: float = 0.95) -> dict[str, Any]:
    """What a held-out rate carries beside it: the power, the effect it is for, the
    test, and whether a verdict at this n can be read at all."""
    power = wilson_power(effect, n, level)
    return {"power": power, "effect": effect.name, "paper_rate": effect.paper_rate, "threshold": effect.threshold,
            "side": effect.side, "paper": effect.paper, "test": POWER_TEST, "n": int(n),
            "testable": bool(power >= MIN_POWER)}


def discordant_counts(before: ArrayLike, after: ArrayLike) -> tuple[int, int]:
    """McNemar's discordant pairs for paired binary outcomes: b = right before and
    wrong after, c = wrong before and right after."""
    x0 = _as_binary(before, "before")
    x1 = _as_binary(after, "after")
    if x0.shape != x1.shape:
        raise ValueError(f"paired arrays differ in length: {x0.size} vs {x1.size}")
    return int((x0 & ~x1).sum()), int((~x0 & x1).sum())


def _as_binary(x: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(x).ravel()
    if arr.dtype != bool:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name} must be binary (0/1 or bool)")
        arr = arr.astype(bool)
    return arr


def paired_diff_ci(
    x_before: ArrayLike,
    x_after: ArrayLike,
    *,
    level: float = 0.95,
    method: Literal["newcombe", "bootstrap"] = "newcombe",
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Interval for mean(x_after) - mean(x_before) over paired units.

    "newcombe": Newcombe's (1998) square-and-add interval for paired binary outcomes,
    built from Wilson intervals of both margins and the continuity-corrected phi
    correlation (binary inputs only). "bootstrap": paired percentile bootstrap of the
    per-unit differences (any numeric inputs).
    """
    if method == "bootstrap":
        x0 = np.asarray(x_before, dtype=float).ravel()
        x1 = np.asarray(x_after, dtype=float).ravel()
        if x0.shape != x1.shape:
            raise ValueError(f"paired arrays differ in length: {x0.size} vs {x1.size}")
        return bootstrap_ci(x1 - x0, level=level, n_boot=n_boot, seed=seed)
    if method != "newcombe":
        raise ValueError(f"method must be 'newcombe' or 'bootstrap', got {method!r}")
    return _newcombe_paired(x_before, x_after, level)


def _newcombe_paired(x_before: ArrayLike, x_after: ArrayLike, level: float) -> tuple[float, float]:
    b, c = discordant_counts(x_before, x_after)
    x0 = _as_binary(x_before, "before")
    n = x0.size
    if n == 0:
        return (math.nan, math.nan)
    both = int((x0 & _as_binary(x_after, "after")).sum())
    neither = n - both - b - c
    s1, s0 = both + c, both + b  # successes after / before
    p1, p0 = s1 / n, s0 / n
    l1, u1 = wilson_interval(s1, n, level)
    l0, u0 = wilson_interval(s0, n, level)
    # Correlation of the two margins; Newcombe's continuity correction shrinks a
    # positive association by n/2 and leaves a negative one as is.
    margins = (both + b) * (c + neither) * (both + c) * (b + neither)
    cross = both * neither - b * c
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > n / 2 else cross) / math.sqrt(margins)
    diff = p1 - p0
    down = (p1 - l1) ** 2 + (u0 - p0) ** 2 - 2 * phi * (p1 - l1) * (u0 - p0)
    up = (u1 - p1) ** 2 + (p0 - l0) ** 2 - 2 * phi * (u1 - p1) * (p0 - l0)
    return (max(-1.0, diff - math.sqrt(max(down, 0.0))), min(1.0, diff + math.sqrt(max(up, 0.0))))


def mcnemar(b: int, c: int, exact_below: int = 25) -> dict[str, Any]:
    """McNemar test on discordant counts b and c (see `discordant_counts`).

    Exact two-sided binomial test (b ~ Bin(b + c, 1/2)) when b + c < exact_below,
    where the chi-square approximation is poor; otherwise chi-square with continuity
    correction, max(|b - c| - 1, 0)^2 / (b + c), 1 degree of freedom (the max keeps
    b == c at statistic 0, p = 1). For the exact test the statistic is min(b, c), as
    in statsmodels.
    """
    b, c = int(b), int(c)
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    m = b + c
    if m < exact_below:
        p = 1.0 if m == 0 else min(1.0, 2 * float(stats.binom.cdf(min(b, c), m, 0.5)))
        return {"statistic": float(min(b, c)), "p_value": p, "b": b, "c": c, "method": "exact"}
    chi2 = max(abs(b - c) - 1, 0) ** 2 / m
    return {"statistic": chi2, "p_value": float(stats.chi2.sf(chi2, 1)), "b": b, "c": c, "method": "chi2"}


# -- audit aggregates -------------------------------------------------------------


def audit_summary(
    records: pd.DataFrame,
    probe: str,
    k: int | None = None,
    ci: Literal["wilson", "bootstrap"] = "wilson",
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """D, O_K, gap = O_K - D over questions, with intervals (see module docstring for
    which). `k` in the result is the K used; when k is None it is the common number of
    probe samples per question, or None when questions differ. Plain Python types, so
    the dict can go straight into summary.json."""
    scores = question_scores(records, probe, k)
    n_q = len(scores)
    if n_q == 0:
        raise ValueError("no questions to summarise")
    d = scores["d"].to_numpy(dtype=float)
    o = scores["o"].to_numpy(dtype=float)
    if ci == "wilson":
        d_ci = wilson_interval(d.sum(), n_q, level)
        o_ci = wilson_interval(o.sum(), n_q, level)
        gap_ci = paired_diff_ci(d, o, level=level, method="newcombe")
    elif ci == "bootstrap":
        lo, hi = bootstrap_ci(np.column_stack([d, o, o - d]), level=level, n_boot=n_boot, seed=seed)
        d_ci, o_ci, gap_ci = zip(lo.tolist(), hi.tolist())
    else:
        raise ValueError(f"ci must be 'wilson' or 'bootstrap', got {ci!r}")
    if k is None:
        ns = scores["n"].unique()
        k_used = int(ns[0]) if len(ns) == 1 else None
    else:
        k_used = int(k)
    D, O = float(d.mean()), float(o.mean())
    return {
        "probe": probe,
        "n_questions": n_q,
        "k": k_used,
        "D": D,
        "O_K": O,
        "gap": O - D,
        "D_ci": [float(x) for x in d_ci],
        "O_K_ci": [float(x) for x in o_ci],
        "gap_ci": [float(x) for x in gap_ci],
        "ci": ci,
        "level": level,
    }


def gap_recovery(selector: float, greedy: float, oracle: float) -> float:
    """Share of the greedy-to-oracle gap a selector closes: (selector - greedy) /
    (oracle - greedy). NaN when oracle == greedy (nothing to recover); can be negative
    (selector worse than greedy)."""
    if oracle == greedy:
        return math.nan
    return (selector - greedy) / (oracle - greedy)


def unparsed_rate(records: pd.DataFrame) -> float:
    """Share of candidates with no valid answer of the task's kind (`extracted` is null:
    `Task.read_answer` keeps only a number for a numeric task, one of the question's
    option letters for multiple choice, ...); NaN for no records."""
    _require_columns(records, ("extracted",))
    return float(records["extracted"].isna().mean()) if len(records) else math.nan


# -- multiple choice read against chance --------------------------------------------

#: a deployed answer distribution is flagged when one option takes more than this share
DOMINANT_SHARE = 0.6


def guess_gold_share(answers: Sequence[str | None], gold: Sequence[str], options: Sequence[Sequence[str]]) -> np.ndarray:
    """Per question, the chance that one answer drawn from `answers` (the model's own,
    pooled over the questions) is its gold: the share of ALL answers that name the
    gold, so an answer with no option (None) or one the question lacks is a miss, as it
    would be for the model; uniform over the question's options when there are no
    answers at all."""
    given = list(answers)
    counts = {a: given.count(a) for a in set(given) if a is not None}
    return np.array([counts.get(g, 0) / len(given) if given else 1 / len(opts) for g, opts in zip(gold, options)],
                    dtype=float)


def chance_baselines(
    deployed: Sequence[str | None],
    gold: Sequence[str],
    options: Sequence[Sequence[str]],
    k: int | None,
) -> dict[str, Any]:
    """D and O_K that guessing reaches on these multiple-choice questions, next to the
    model's deployed answer distribution.

    Per question i with options `options[i]` (m_i of them) and gold `gold[i]`:
    - uniform guessing: D = mean 1/m_i, O_K = mean 1 - (1 - 1/m_i)^K (K independent
      uniform draws);
    - guessing like the deployed answers: p_i = `guess_gold_share` (the share of all
      deployed answers that name gold_i; an unanswered one is a miss), D = mean p_i,
      O_K = mean 1 - (1 - p_i)^K: the D of the audit's chance null (`grading.letter_null`),
      which draws its O_K from the probe samples instead.
    `k` None or 0 gives no O_K. `deployed_counts` counts each option (and None as
    "unparsed"); `warning` names an option that takes more than DOMINANT_SHARE of the
    parsed deployed answers (then D mostly measures how often that option is gold).
    """
    if not len(deployed) == len(gold) == len(options):
        raise ValueError(f"need one deployed answer, gold and option list per question, got "
                         f"{len(deployed)}, {len(gold)}, {len(options)}")
    if not len(gold):
        raise ValueError("no questions")
    for opts, g in zip(options, gold):
        if g not in opts:
            raise ValueError(f"gold {g!r} is not one of the options {list(opts)}")
    parsed = [a for a in deployed if a is not None]
    order = list(dict.fromkeys(o for opts in options for o in opts))
    counts = {o: sum(a == o for a in parsed) for o in order}
    counts.update({a: parsed.count(a) for a in parsed if a not in counts})
    total = len(parsed)

    def at(p: np.ndarray) -> dict[str, float | None]:
        o_k = float(np.mean(1 - (1 - p) ** k)) if k else None
        return {"D": float(p.mean()), "O_K": o_k}

    dominant = max(counts, key=lambda o: counts[o]) if total else None
    share = counts[dominant] / total if dominant is not None else 0.0
    warning = None
    if share > DOMINANT_SHARE:
        warning = (f"option {dominant!r} is {share:.0%} of the parsed deployed answers "
                   f"({counts[dominant]} of {total}): D largely counts the questions whose gold is {dominant!r}")
    return {
        "k": k,
        "uniform": at(1 / np.array([len(o) for o in options], dtype=float)),
        "deployed_distribution": at(guess_gold_share(deployed, gold, options)),
        "deployed_counts": {**counts, "unparsed": len(deployed) - total},
        "dominant": dominant,
        "dominant_share": share,
        "warning": warning,
    }


def answer_changes(before: Sequence[str | None], after: Sequence[str | None], gold: Sequence[str]) -> dict[str, Any]:
    """How an intervention moved deployed answers on the same questions: `to_gold`
    (changed, now the gold option: the repairs), `to_other` (changed to another wrong
    answer, or to none), `unchanged`, and `after_counts`, the answers the changed
    questions moved to. Many changes onto one option mean the intervention shifted the
    answer bias rather than fixed the questions; compare `to_gold` with
    `to_gold_by_chance`, the repairs expected if the changed questions had drawn their
    new answer from `after_counts` whatever their gold."""
    if not len(before) == len(after) == len(gold):
        raise ValueError(f"need paired answers, got {len(before)}, {len(after)}, {len(gold)}")
    changed = [(a, g) for b, a, g in zip(before, after, gold) if a != b]
    to_gold = sum(a == g for a, g in changed)
    moved = [a for a, _ in changed if a is not None]
    after_counts = {a: moved.count(a) for a in dict.fromkeys(moved)}
    by_chance = sum(after_counts.get(g, 0) / len(moved) for _, g in changed) if moved else 0.0
    return {
        "n": len(gold),
        "changed": len(changed),
        "to_gold": to_gold,
        "to_other": len(changed) - to_gold,
        "unchanged": len(gold) - len(changed),
        "after_counts": after_counts,
        "to_gold_by_chance": float(by_chance),
    }


def oracle_curve_after_first(first_correct: bool, n_rest: int, c_rest: int, ks: ArrayLike) -> np.ndarray:
    """o(k) for a probe whose first candidate is fixed (the full path of a routing
    probe) and whose other n_rest candidates are exchangeable draws, c_rest of them
    correct: 1 when the first is correct, else the unbiased pass@(k-1) of the rest
    (0 at k = 1). Every method's curve then starts from the same K=1 point."""
    ks_arr = np.atleast_1d(np.asarray(ks, dtype=np.int64))
    if first_correct:
        return np.ones(ks_arr.shape)
    out = np.zeros(ks_arr.shape)
    later = ks_arr > 1
    if later.any():
        out[later] = pass_at_k_curve(n_rest, c_rest, ks_arr[later] - 1)
    return out


def vote_curve(
    answers: Sequence[Any],
    correct: Sequence[bool],
    ks: ArrayLike,
    weights: Sequence[float] | None = None,
    fixed_first: int = 0,
    n_orderings: int = 200,
    seed: int = 0,
) -> np.ndarray:
    """Expected correctness of the answer-blind vote over k of a question's n candidates,
    for each k in `ks` (the deployable line beside the oracle curve).

    The vote: the answer with the most votes (a candidate's vote counts `weights[i]`,
    1 when None; candidates without an answer, None or NaN, do not vote; no votes is an
    abstention, graded wrong); a tie goes to the tied answer seen first.
    The subsets: the first `fixed_first` candidates are always in (a routing probe's
    full path), the other k - fixed_first are a uniformly random subset of the rest.
    Estimator: for k < n, the mean over `n_orderings` seeded random orderings of the
    free candidates of the vote over each ordering's first k (every prefix of a uniform
    random ordering is a uniform random subset, and "seen first" is then in that random
    order); for k = n, the vote over all candidates in record order, which is exactly
    what the deployed selector picks.
    """
    n = len(answers)
    if len(correct) != n or (weights is not None and len(weights) != n):
        raise ValueError("answers, correct and weights must be equally long")
    ks_arr = np.atleast_1d(np.asarray(ks, dtype=np.int64))
    if n == 0 or ks_arr.size == 0:
        return np.zeros(ks_arr.shape)
    if ks_arr.min() < max(1, fixed_first) or ks_arr.max() > n:
        raise ValueError(f"vote@k needs {max(1, fixed_first)} <= k <= n={n}, got {ks_arr.tolist()}")
    codes, right = _answer_codes(answers, correct)
    w = np.ones(n) if weights is None else np.nan_to_num(np.asarray(weights, dtype=float), nan=0.0)
    rng = np.random.default_rng(seed)
    free = np.arange(fixed_first, n)
    orders = [np.arange(n)] + [np.concatenate([np.arange(fixed_first), rng.permutation(free)]) for _ in range(n_orderings)]
    picks = _prefix_votes(codes[np.stack(orders)], w[np.stack(orders)], len(right))  # (orderings, n)
    hit = np.where(picks >= 0, right[np.maximum(picks, 0)], False).astype(float) if len(right) else np.zeros(picks.shape)
    out = hit[1:, ks_arr - 1].mean(axis=0) if n_orderings else hit[0, ks_arr - 1]
    return np.where(ks_arr == n, hit[0, ks_arr - 1], out)


def _answer_codes(answers: Sequence[Any], correct: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Answers as integer codes (-1: no answer) and, per code, whether it is correct."""
    index: dict[Any, int] = {}
    right: list[bool] = []
    codes = np.full(len(answers), -1, dtype=np.int64)
    for i, (a, ok) in enumerate(zip(answers, correct)):
        if a is None or (isinstance(a, float) and math.isnan(a)):
            continue
        if a not in index:
            index[a] = len(right)
            right.append(bool(ok))
        codes[i] = index[a]
    return codes, np.asarray(right, dtype=bool)


def _prefix_votes(codes: np.ndarray, weights: np.ndarray, n_answers: int) -> np.ndarray:
    """For each row (an ordering) and each prefix length, the winning answer code of the
    weighted vote over the prefix (-1 when nothing in it voted); ties to the answer whose
    first vote comes first."""
    rows, n = codes.shape
    if n_answers == 0:
        return np.full((rows, n), -1)
    onehot = (codes[..., None] == np.arange(n_answers)) * weights[..., None]  # (rows, n, A)
    tally = onehot.cumsum(axis=1)
    voted = (codes[..., None] == np.arange(n_answers))
    first = np.where(voted.any(axis=1), voted.argmax(axis=1), n)  # (rows, A) first position
    top = tally.max(axis=2, keepdims=True)
    tied = (tally >= top - 1e-12) & (top > 0)
    seen = np.where(tied, first[:, None, :], n + 1)
    winner = seen.argmin(axis=2)
    return np.where(top[..., 0] > 0, winner, -1)


#: bytes `_prefix_votes` holds at its peak per (ordering, candidate, distinct answer):
#: the weighted one-hot and its running tally (float64), the tie positions (int64) and
#: three boolean masks (measured: 26-27)
VOTE_CELL_BYTES = 27


def vote_table_bytes(n_candidates: int, n_answers: int | None = None, n_orderings: int = 200) -> int:
    """Peak memory of `vote_curve` (one question at a time, as `vote_matrix` runs it) over
    `n_candidates` with at most `n_answers` distinct answers (None: every candidate's
    own, the worst case for free-form answers)."""
    answers = n_candidates if n_answers is None else max(1, min(n_answers, n_candidates))
    rows = n_orderings + 1
    return rows * n_candidates * (answers * VOTE_CELL_BYTES + 64)


def vote_matrix(candidates: Sequence[pd.DataFrame], ks: ArrayLike, weighted: bool = False, fixed_first: int = 0,
                seed: int = 0) -> np.ndarray:
    """(questions, len(ks)): `vote_curve` for each question's candidate table (columns
    extracted, correct, and logprob, n_tokens when `weighted`: each vote then counts the
    candidate's per-token probability exp(logprob / n_tokens))."""
    return np.stack([
        vote_curve(g["extracted"].tolist(), g["correct"].astype(bool).tolist(), ks,
                   weights=np.exp(g["logprob"] / g["n_tokens"].clip(lower=1)).tolist() if weighted else None,
                   fixed_first=fixed_first, seed=seed)
        for g in candidates
    ])


def gap_recovery_ci(
    deployed: ArrayLike, oracle: ArrayLike, selector: ArrayLike, *, level: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Paired percentile bootstrap interval (questions resampled, the three columns
    together) for gap recovery (S - D) / (O - D); resamples with O == D have no gap to
    recover and are left out. (nan, nan) when the sample itself has no gap (the point
    estimate is undefined) or fewer than half of the resamples have one."""
    values = np.column_stack([np.asarray(x, dtype=float).ravel() for x in (deployed, oracle, selector)])
    if values[:, 1].mean() == values[:, 0].mean():
        return (math.nan, math.nan)
    means = _bootstrap_stats(values, None, n_boot, seed)  # (n_boot, 3) column means
    gap = means[:, 1] - means[:, 0]
    ok = gap != 0
    if ok.sum() < n_boot / 2:
        return (math.nan, math.nan)
    ratios = (means[ok, 2] - means[ok, 0]) / gap[ok]
    alpha = 1 - level
    lo, hi = np.quantile(ratios, [alpha / 2, 1 - alpha / 2])
    return (float(lo), float(hi))


def selection_summary(
    deployed: ArrayLike, oracle: ArrayLike, selector: ArrayLike, *, level: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """One answer-blind selector against the greedy-to-oracle gap, per-question paired:
    its accuracy S (Wilson), the selection gap O - S (Newcombe paired), S - D (Newcombe
    paired) and gap recovery (S - D) / (O - D) (paired bootstrap). Binary inputs."""
    d, o, s = (_as_binary(x, name).astype(float) for x, name in ((deployed, "deployed"), (oracle, "oracle"), (selector, "selector")))
    if not d.size == o.size == s.size:
        raise ValueError("deployed, oracle and selector must cover the same questions")
    n = d.size
    D, O, S = float(d.mean()), float(o.mean()), float(s.mean())
    return {
        "accuracy": S,
        "accuracy_ci": [float(x) for x in wilson_interval(s.sum(), n, level)],
        "selection_gap": O - S,
        "selection_gap_ci": [float(x) for x in paired_diff_ci(s, o, level=level)],
        "minus_deployed": S - D,
        "minus_deployed_ci": [float(x) for x in paired_diff_ci(d, s, level=level)],
        "gap_recovery": gap_recovery(S, D, O),
        "gap_recovery_ci": list(gap_recovery_ci(d, o, s, level=level, n_boot=n_boot, seed=seed)),
    }
