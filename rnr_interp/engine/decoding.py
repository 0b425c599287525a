"""What every decoding engine shares: the decoding parameters (`Decoding`), what a
continuation is (`Generation`), the engine contract (`Engine`), which backends exist and
which have hooks, and the argument rules both engines apply (`plan_columns`, `check_hooks`,
`cut_at_stop`). The bridge engine (`generate`) and the vLLM engine (`vllm_backend`) are
built on this module; neither imports the other."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:  # kept out at run time: this module stays free of torch, so the CLI can read its defaults
    from rnr_interp.interventions import Intervention


#: the probes' sampling temperature wherever none is given: every command, the Python API
#: and the reproduction (the temperature sweep sets its own grid)
SAMPLING_TEMPERATURE = 1.0


@dataclass(frozen=True)
class Decoding:
    """How candidates are decoded. temperature 0 is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 64

    def __post_init__(self):
        # `not x >= 0` rather than `x < 0`: NaN fails every comparison and must be refused.
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a whole number >= 1, got {self.max_new_tokens}")


@dataclass
class Generation:
    tokens: list[int]
    text: str
    #: sum of the chosen tokens' log-probs under the model (temperature 1, no top-p)
    logprob: float
    #: "stop" (stop token or stop string) or "length"
    finish: str
    #: each chosen token's log-prob (same measure as `logprob`, which is their sum)
    token_logprobs: list[float] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


class Engine(Protocol):
    """A decoding engine: `n` continuations per prompt, result[b][j] for prompt b,
    column j. Column j decodes with `decoding`, or with columns[j] when each column has
    its own (temperature 0 is greedy), and seed seeds[b][j]; text is cut at the first
    stop string. An engine without hooks refuses
    any intervention (`check_hooks`)."""

    def __call__(self, lm, prompts: Sequence[Sequence[int]], /, *, n: int = 1, decoding: Decoding | None = None,
                 columns: Sequence[Decoding] | None = None, seeds: Sequence[Sequence[int]] | None = None,
                 interventions: Sequence[Intervention] | Sequence[Sequence[Intervention]] | None = None,
                 stop_strings: Sequence[str] = ()) -> list[list[Generation]]: ...


#: "tl": the bridge engine (TransformerLens hooks, every intervention); "vllm": plain sampling
BACKENDS = ("tl", "vllm")
#: the backends whose engine runs the intervention registry's hooks
HOOKED_BACKENDS = ("tl",)


def check_hooks(backend: str, interventions: Sequence[Intervention]) -> None:
    """The one place that refuses interventions on an engine without hooks."""
    if interventions and backend not in HOOKED_BACKENDS:
        raise ValueError(f"interventions need hooks: the {backend!r} backend cannot apply them; "
                         "use the TransformerLens backend ('tl')")


def plan_columns(n: int, n_prompts: int, decoding: Decoding | None, per_column: Sequence[Decoding] | None,
            seeds: Sequence[Sequence[int]] | None) -> tuple[list[Decoding], Sequence[Sequence[int]]]:
    """Each column's decoding (`decoding` for all n, or one per column: never both, so a
    temperature or top-p reaches the engine once) and each (prompt, column)'s seed: the
    request rules every engine applies the same way. Columns share one token budget."""
    if per_column is None:
        cols = [decoding if decoding is not None else Decoding()] * n
    elif decoding is not None:
        raise ValueError("give one decoding for every column or one per column (`columns`), not both")
    else:
        cols = list(per_column)
    if len(cols) != n:
        raise ValueError(f"got {len(cols)} column decodings for n={n} columns")
    if len({c.max_new_tokens for c in cols}) > 1:
        raise ValueError(f"the columns of one call share max_new_tokens; got {sorted({c.max_new_tokens for c in cols})}")
    if any(c.temperature > 0 for c in cols) and seeds is None:
        raise ValueError("sampling (temperature > 0) needs seeds")
    return cols, seeds or [[0] * n for _ in range(n_prompts)]


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """`text` up to the first stop string (all of it when none occurs)."""
    cut = min((text.find(s) for s in stop_strings if s in text), default=-1)
    return text[:cut] if cut >= 0 else text
