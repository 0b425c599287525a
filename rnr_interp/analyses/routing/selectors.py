"""Answer-blind selectors: pick one candidate answer per question without the gold answer.

A question's candidates (one per route or sample) form a table with columns
`extracted` (the parsed answer, None/NaN when none parsed), `logprob` (summed token
log-probability of the generation), `n_tokens`, and optionally `verify_yes_logprob`
(log P("yes") when the model is asked whether the candidate is right; computed
elsewhere). The selectors are pure functions over those columns and return the chosen
candidate's row index, or None when no candidate has an answer (an abstention, graded
wrong). Candidates without an answer never win: picking one is a sure miss that
needs no gold answer to foresee. `select(table, method)` reads the columns from a
pandas DataFrame, a mapping of columns, or a list of row mappings.

Confidence is the mean token log-probability, logprob / n_tokens, so long and short
generations compare fairly. Ties go to the earliest candidate unless stated.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Hashable, Mapping, Sequence

Answer = Hashable


def _answer(value: Any) -> Answer | None:
    """None for a missing answer (None, NaN, pandas NA), else the value as given."""
    if value is None:
        return None
    try:
        return None if value != value else value  # NaN is the one value unequal to itself
    except TypeError:  # pandas.NA refuses to be a bool
        return None


def _answered(extracted: Sequence[Any]) -> list[int]:
    return [i for i, value in enumerate(extracted) if _answer(value) is not None]


def _score(value: Any) -> float:
    value = float(value)
    return -math.inf if math.isnan(value) else value


def mean_logprob(logprob: Sequence[float], n_tokens: Sequence[int]) -> list[float]:
    """Per-candidate confidence: log-probability per token (an empty generation counts
    as one token; a missing log-probability as -inf)."""
    return [_score(lp) / max(int(n), 1) for lp, n in zip(logprob, n_tokens)]


def _argmax(indices: Sequence[int], *keys: Sequence[float]) -> int | None:
    """The index maximising keys[0], then keys[1], ...; the earliest on a full tie."""
    if not indices:
        return None
    return max(indices, key=lambda i: (*(_score(k[i]) for k in keys), -i))


def majority_answer(extracted: Sequence[Any]) -> Answer | None:
    """The most frequent answer, missing ones ignored; ties go to the answer seen first."""
    extracted = list(extracted)
    index = majority_vote(extracted)
    return None if index is None else _answer(extracted[index])


def majority_vote(
    extracted: Sequence[Any], tie_break: str = "first", confidence: Sequence[float] | None = None
) -> int | None:
    """A candidate carrying the most frequent answer (missing answers ignored).

    tie_break="first": among equally frequent answers the one seen first wins, and the
    index returned is its first occurrence. tie_break="confidence": the answer whose
    most confident candidate is most confident wins (then the earlier such candidate),
    and the index returned is that candidate; needs `confidence` (e.g. `mean_logprob`).
    """
    extracted = list(extracted)
    if tie_break not in ("first", "confidence"):
        raise ValueError(f"tie_break must be 'first' or 'confidence', not {tie_break!r}")
    if tie_break == "confidence" and confidence is None:
        raise ValueError("tie_break='confidence' needs the confidence column")
    groups: dict[Answer, list[int]] = {}
    for i in _answered(extracted):
        groups.setdefault(_answer(extracted[i]), []).append(i)
    if not groups:
        return None
    top = max(len(members) for members in groups.values())
    tied = [members for members in groups.values() if len(members) == top]  # in first-seen order
    if tie_break == "first":
        return tied[0][0]
    confidence = list(confidence)  # by position, whatever index a pandas column has
    best = [_argmax(members, confidence) for members in tied]
    return _argmax(best, confidence)


def confidence(
    logprob: Sequence[float], n_tokens: Sequence[int], extracted: Sequence[Any] | None = None
) -> int | None:
    """The candidate with the highest mean token log-probability; only candidates with
    an answer compete when `extracted` is given."""
    indices = _answered(extracted) if extracted is not None else range(len(logprob))
    return _argmax(list(indices), mean_logprob(logprob, n_tokens))


def self_verification(
    verify_yes_logprob: Sequence[float],
    extracted: Sequence[Any] | None = None,
    confidence: Sequence[float] | None = None,
) -> int | None:
    """The candidate the model most confidently calls right: the highest log P("yes"),
    then the highest `confidence` (if given), then the earliest. When no candidate gets
    a "yes" this is still the least doubted one."""
    keys = [list(verify_yes_logprob)] + ([] if confidence is None else [list(confidence)])  # by position
    indices = _answered(extracted) if extracted is not None else range(len(keys[0]))
    return _argmax(list(indices), *keys)


def weighted_majority(
    extracted: Sequence[Any], logprob: Sequence[float], n_tokens: Sequence[int]
) -> int | None:
    """Confidence-weighted vote: each answered candidate votes with its per-token
    probability exp(logprob / n_tokens); the answer with the largest total wins (ties:
    the answer seen first), and the index returned is its first occurrence."""
    extracted = list(extracted)
    weight = [math.exp(c) for c in mean_logprob(logprob, n_tokens)]
    totals: dict[Answer, float] = {}
    first: dict[Answer, int] = {}
    for i in _answered(extracted):
        a = _answer(extracted[i])
        totals[a] = totals.get(a, 0.0) + weight[i]
        first.setdefault(a, i)
    if not totals:
        return None
    best = max(totals.values())
    return min(first[a] for a, t in totals.items() if t >= best - 1e-12)


def search_reward(extracted: Any, logprob: float, n_tokens: int) -> float:
    """The answer-blind reward the search selectors maximise: the model's per-token
    probability of its own output, exp(logprob / n_tokens), in (0, 1]; 0 for an output
    with no answer (a sure miss). Maximising it is the `confidence` selector's order,
    so a search selector's pick is `confidence` over the routes its search evaluated."""
    if _answer(extracted) is None:
        return 0.0
    return math.exp(mean_logprob([logprob], [n_tokens])[0])


# -- tables ----------------------------------------------------------------

Table = Any  # a pandas DataFrame, a mapping of columns, or a sequence of row mappings


def column(table: Table, name: str) -> list[Any]:
    if isinstance(table, Sequence) and not isinstance(table, (str, bytes)):
        return [row[name] for row in table]
    if name not in table:
        raise KeyError(f"candidate table has no {name!r} column")
    return list(table[name])


def _has(table: Table, name: str) -> bool:
    if isinstance(table, Sequence) and not isinstance(table, (str, bytes)):
        return bool(table) and all(isinstance(row, Mapping) and name in row for row in table)
    return name in table


def _confidence_column(table: Table) -> list[float] | None:
    if _has(table, "logprob") and _has(table, "n_tokens"):
        return mean_logprob(column(table, "logprob"), column(table, "n_tokens"))
    return None


SELECTORS: dict[str, Callable[[Table], int | None]] = {
    "majority": lambda t: majority_vote(column(t, "extracted")),
    "majority_confidence": lambda t: majority_vote(column(t, "extracted"), "confidence", _confidence_column(t)),
    "weighted_majority": lambda t: weighted_majority(column(t, "extracted"), column(t, "logprob"), column(t, "n_tokens")),
    "confidence": lambda t: confidence(column(t, "logprob"), column(t, "n_tokens"), column(t, "extracted")),
    "self_verification": lambda t: self_verification(
        column(t, "verify_yes_logprob"), column(t, "extracted"), _confidence_column(t)
    ),
}


def select(table: Table, method: str) -> int | None:
    """The row `method` (a key of SELECTORS) picks from a candidate table."""
    if method not in SELECTORS:
        raise ValueError(f"unknown selector {method!r}; one of {sorted(SELECTORS)}")
    return SELECTORS[method](table)
