"""Layer routing: which block orders to try (spaces), how to search them for one
question under a budget of evaluations (search, an oracle when fed the gold answer),
and how to pick an answer without the gold answer (selectors)."""

from .search import SEARCHES, BudgetExceeded, Evaluator, SearchResult, genetic, hill_climb, mcts, random_search
from .selectors import (
    SELECTORS,
    confidence,
    majority_answer,
    majority_vote,
    mean_logprob,
    search_reward,
    select,
    self_verification,
    weighted_majority,
)
from .spaces import SPACES, STOP, Edit, LayerPath, RouteSpace, default_bounds, make_space, polar_decode, polar_encode

__all__ = [
    "SEARCHES",
    "SELECTORS",
    "SPACES",
    "STOP",
    "BudgetExceeded",
    "Edit",
    "Evaluator",
    "LayerPath",
    "RouteSpace",
    "SearchResult",
    "confidence",
    "default_bounds",
    "genetic",
    "hill_climb",
    "majority_answer",
    "majority_vote",
    "make_space",
    "mcts",
    "mean_logprob",
    "polar_decode",
    "polar_encode",
    "random_search",
    "search_reward",
    "select",
    "self_verification",
    "weighted_majority",
]
