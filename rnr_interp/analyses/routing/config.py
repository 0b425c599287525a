"""The routing audit's settings: what a route run is asked to do (`RouteConfig`), the
method and selector names it knows, the spaces a config builds on a model, and how a
run folder's stored settings are read back."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from rnr_interp.engine.decoding import SAMPLING_TEMPERATURE, Decoding
from rnr_interp.engine.sampling import run_config
from rnr_interp.models import LoadedModel
from rnr_interp.records import ROUTE, RunDir, RunFolderError
from rnr_interp.analyses.routing.search import ADAPTIVE, SEARCHES
from rnr_interp.analyses.routing.spaces import SPACES, RouteSpace, make_space, space_size
from rnr_interp.tasks.base import Task

STRUCTURED = ADAPTIVE
#: how each search's random stream is seeded (`evaluator.search_rng`), as the manifest names it
SEED_STREAMS = ("numpy default_rng(SeedSequence([seed, crc32(probe label), crc32(question id)])): one stream per "
                "search (space:method) and question, so no two questions share a random route list and no two "
                "methods share a draw")


#: how far above zero the lower bound of oracle - null must be to call an oracle above
#: chance: a bootstrap quantile of differences of sums of 1/n can land a rounding error
#: (such as 8.17e-18) off an exact 0, and that decided a call before
CHANCE_TOLERANCE = 1e-9


def above_chance(lower_bound: float) -> bool:
    """Whether an oracle whose oracle - null interval starts at `lower_bound` is above
    its chance null: the bound exceeds 0 by more than floating-point error."""
    return bool(lower_bound > CHANCE_TOLERANCE)


def matched_control(search: str) -> str:
    """The probe method of `search`'s own `random_matched` control, random routes at that
    search's distances ("random_matched_mcts"; a probe label's parts are split at ':')."""
    return f"random_matched_{search}"


def draws_at_random(method: str) -> bool:
    """Whether `method`'s routes after the full path are drawn without a reward (random,
    random_matched and each search's matched control): exchangeable draws."""
    return method == "random" or method.startswith("random_matched")


#: selectors over a probe's K candidates (weighted_majority is majority's second line)
CANDIDATE_SELECTORS = ("majority", "weighted_majority", "confidence", "self_verification")
#: answer-blind searches: probe method -> the search run with `search_reward`
BLIND_SEARCHES = {f"{m}_blind": m for m in STRUCTURED}
#: selectors over a blind search's evaluated routes: name -> (blind probe method, selector)
SEARCH_SELECTORS = {
    **{f"{m}_vote": (f"{m}_blind", "majority") for m in STRUCTURED},
    **{f"{m}_confidence": (f"{m}_blind", "confidence") for m in STRUCTURED},
}
VOTES = {"majority": False, "weighted_majority": True}  # deployable lines: confidence-weighted?
#: rows (question, route) per batched generation in the audit, whatever its questions per
#: chunk: a batch takes rows from every search of the chunk (`run_searches`), and on a CPU
#: a decoding step of few rows spends most of its time reading weights
#: (benchmarks/route_batching.py; README, routing). A cost knob: results do not depend on it.
ROUTE_ROWS = 64
#: the same off the CPU: on a GPU rows are nearly free (a decoding step of 720 rows took
#: about 1.5x one of 32 in the silencing sweep on an H200; README), so a batch holds what
#: the round has, up to this. Memory: about 21 MB of keys and values a row at 456
#: positions (a GSM8K prompt and 256 new tokens) on the demo model, 11 GB for 512.
GPU_ROUTE_ROWS = 512


def route_rows(lm: LoadedModel) -> int:
    """Rows per batched route generation on `lm`'s device (a cost knob)."""
    return ROUTE_ROWS if lm.device.type == "cpu" else GPU_ROUTE_ROWS


@dataclass(frozen=True)
class RouteConfig:
    #: K temperature samples per question (the `temperature` probe)
    samples: int = 32
    #: route evaluations per search and question: the matched budget K of every method and selector
    budget: int = 32
    spaces: tuple[str, ...] = ("native",)
    methods: tuple[str, ...] = ("random", "random_matched", "mcts", "hill_climb", "genetic")
    #: routes each structured search (gold-rewarded and blind) proposes per round: None
    #: for each search's default (MCTS 1, hill climbing 8 neighbours, genetic one
    #: generation of 8); 1 makes every search sequential. The budget stays K distinct
    #: routes whatever this is; it changes which routes an adaptive search picks.
    proposals: int | None = None
    temperature: float = SAMPLING_TEMPERATURE
    seed: int = 0
    collapse: float = 0.5
    #: questions per chunk: the lockstep's unit and a records part (a batch holds
    #: max(batch_size, `route_rows`) rows, from every search of the chunk); a chunk
    #: stopped part way keeps its work in the run's journal
    batch_size: int = 16
    reuse_prefix: bool = True
    #: route length bounds (None: the space's defaults, L -/+ L//3)
    min_len: int | None = None
    max_len: int | None = None

    def __post_init__(self):
        """Refuse bad settings when the config is made, before any run folder is."""
        for name in ("samples", "budget", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a number > 0, got {self.temperature}")
        if not math.isfinite(self.collapse):  # a threshold on the unparsed rate (< 0: exclude every cell)
            raise ValueError(f"collapse must be a number, got {self.collapse}")
        for name in ("min_len", "max_len"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.min_len is not None and self.max_len is not None and self.min_len > self.max_len:
            raise ValueError(f"min_len {self.min_len} is above max_len {self.max_len}")
        unknown = [s for s in self.spaces if s not in SPACES]
        if unknown or not self.spaces:
            raise ValueError(f"spaces must be some of {', '.join(SPACES)}, got {list(self.spaces)}")
        unknown = [m for m in self.methods if m not in SEARCHES]
        if unknown or not self.methods:
            raise ValueError(f"methods must be some of {', '.join(SEARCHES)}, got {list(self.methods)}")
        if "random_matched" in self.methods and not set(self.methods) & set(STRUCTURED):
            raise ValueError("random_matched matches the structured searches' routes: give one of "
                             f"{', '.join(STRUCTURED)} with it")
        if self.proposals is not None and self.proposals < 1:
            raise ValueError(f"proposals must be >= 1, got {self.proposals}")




def route_spaces(cfg: RouteConfig, n_layers: int) -> dict[str, RouteSpace]:
    """The route spaces of `cfg` on a model of `n_layers` blocks. Refused (ValueError)
    when a space holds fewer distinct routes than the budget: every search evaluates
    `budget` distinct routes per question, and the oracle and vote curves are drawn to
    the budget, so such a run could write its records but never its summary."""
    spaces = {name: make_space(name, n_layers, min_len=cfg.min_len, max_len=cfg.max_len) for name in cfg.spaces}
    sizes = {name: space_size(space) for name, space in spaces.items()}
    small = [name for name, size in sizes.items() if size < cfg.budget]
    if small:
        space = spaces[small[0]]
        raise ValueError(
            f"route budget {cfg.budget} (--budget, else --k) is more than the {sizes[small[0]]} distinct routes of space "
            f"{space.name!r} on this {n_layers}-layer model (route lengths {space.min_len}..{space.max_len}); "
            f"the largest budget that works is {min(sizes.values())}")
    return spaces



def route_config_of(run: RunDir) -> RouteConfig:
    """The RouteConfig a route run folder was started with."""
    run.require_kind(ROUTE)
    stored = run.config.get("route") or {}
    try:
        return RouteConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})
    except TypeError as err:
        raise RunFolderError(f"{run.path}: route settings this version does not know ({err})") from None



def route_decoding(task: Task) -> Decoding:
    """How every route and the deployed full path decode: greedy, to the task's length."""
    return Decoding(max_new_tokens=task.max_new_tokens)


def route_run_config(lm: LoadedModel, task: Task, cfg: RouteConfig, grading: str | None = None) -> dict[str, Any]:
    """The run config of a route audit: what a run folder stores and a resume checks.
    `grading` None: the folder's own when resuming, else the default."""
    samplers = {name: make_space(name, lm.n_layers, min_len=cfg.min_len, max_len=cfg.max_len).sampler for name in cfg.spaces}
    return run_config(ROUTE, lm, task, grading=grading, route=asdict(cfg), deployed=asdict(route_decoding(task)),
                      random_samplers=samplers, seed_streams=SEED_STREAMS)
