"""Size profiles of the reproduction: how many questions, samples and steps each part
spends, and why. The protocol (what each part measures) is the same in every profile;
only the sizes change.

- `smoke`: random-weight tiny models on the synthetic tasks, a few questions per part;
  exercises every part end to end in the test suite (no data files, no downloads).
- `demo`: SmolLM2-135M on the real splits in ``../shared/data``, sized to what a shared
  2-core CPU machine finishes in a few hours (see `Profile.why`).
- `full`: the sizes the paper's claims need (gap intervals narrower than +-0.1, 40+
  questions per routing cell); a GPU run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rnr_interp.engine.decoding import SAMPLING_TEMPERATURE

#: the six tasks the paper and ../shared/data share (ARC-Easy is the demo's seventh,
#: used by localisation, not by the audit part)
PAPER_TASKS = ("arc_challenge", "piqa", "boolq", "logiqa", "hellaswag", "gsm8k")  # GSM8K last: 256 new tokens
MC_TASKS = ("arc_challenge", "arc_easy", "piqa", "boolq", "logiqa", "hellaswag")
SPACES = ("native", "polar", "skiponly")
METHODS = ("random", "random_matched", "mcts", "hill_climb", "genetic")


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    # part 1: realization audit
    audit_tasks: tuple[str, ...]
    audit_n: int
    k: int
    # part 2: routing cells (tasks x spaces), matched budget K
    route_tasks: tuple[str, ...]
    route_n: int
    route_k: int
    # part 3: temperature sweep of the selection gap
    sweep_task: str
    sweep_n: int
    sweep_k: int
    # part 4: failure screen, then localisation on cells that pass
    screen_tasks: tuple[str, ...]
    screen_n: int
    # part 5: checkpoint audit (base vs GRPO and SFT)
    ckpt_task: str
    ckpt_n: int
    ckpt_k: int
    train_steps: int
    temperatures: tuple[float, ...] = (0.7, 1.0, 1.3)
    spaces: tuple[str, ...] = SPACES
    methods: tuple[str, ...] = METHODS
    route_min_len: int | None = None
    #: steering strengths in residual RMS norms along unit v (`steering.ALPHA_UNITS`);
    #: the findings judge at 1 (rescue) and 0.5 (induction), fixed in advance
    alphas: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0)
    unit_ks: tuple[int, ...] = (1, 4, 16, 32, 64)
    #: the cell-level failure screen (`recognition.FailureCriterion`): recognition -
    #: generation >= margin with its paired interval at this level above 0
    screen_margin: float = 0.10
    screen_level: float = 0.95
    #: the screen also asks recognition above chance (off only in the smoke profile)
    screen_above_chance: bool = True
    ckpt_temperature: float = SAMPLING_TEMPERATURE
    recipes: tuple[str, ...] = ("grpo", "sft")
    #: questions per batch in the sampling parts (each question fans out to K + 1 rows)
    batch_size: int = 8
    #: rows (a question under one intervention set) per batch in localisation: 32 rows
    #: took 132 s where 8 took 333 s on this 2-core CPU (32 ARC-Challenge questions, greedy,
    #: 32 new tokens; one run each, one after the other, beside another model job: a
    #: rough ratio, not an interleaved measurement)
    rows_batch_size: int = 32
    #: questions per lockstep chunk of the routing audit (a records part; a chunk in
    #: progress is kept in the run's journal), and (question, route) rows per batch. A
    #: chunk's searches take the same number of rounds whatever its size, so bigger
    #: chunks pay where per-forward overhead dominates (a GPU); on a CPU the cost is
    #: compute, about linear in questions
    route_batch_size: int = 8
    #: the letter-permutation control (options rotated by one) in repair and steering,
    #: on cells graded by option letter: it tells a repair that follows the content from
    #: one that only moved the model's letter bias (issue 17)
    permutation_control: bool = True
    #: localisation under the circular protocol (every cyclic shift of the options; the
    #: deployed answer is right only when right under all): letter-robust failure sets,
    #: repairs and flips, at as many times the rows as the options (issue 34)
    circular: bool = True
    #: part 5's budget control samples this many per question when larger than 2K, so the
    #: source-of-gains curve reaches a budget nearer the paper's K >= 200 (None: 2K)
    ckpt_budget_k: int | None = None
    #: part 6: `rnr validate` per localisation task at screen_n, with this validation
    #: profile (`analyses.validate.PROFILES`) and golds ("base": anchored to the model's own answers)
    validate_profile: str = "quick"
    validate_gold: str = "base"
    #: parts left out of a run that names none (``--parts`` runs them): their cost beside
    #: what they add at this profile's size; which parts run decides no run, so no resume key
    opt_in: tuple[str, ...] = ()
    #: part -> why these sizes (printed with the plan, stated in the index report)
    why: dict[str, str] = field(default_factory=dict, compare=False)

    def config(self) -> dict[str, Any]:
        """What decides the runs (the resume key): everything but the prose."""
        out = asdict(self)
        out.pop("why")
        out.pop("opt_in")
        return out


SMOKE = Profile(
    name="smoke", model="tiny-llama",
    audit_tasks=("arithmetic", "arithmetic_mc"), audit_n=3, k=4,
    route_tasks=("arithmetic",), route_n=2, route_k=4,
    sweep_task="arithmetic", sweep_n=3, sweep_k=4,
    screen_tasks=("arithmetic_mc",), screen_n=8,
    ckpt_task="arithmetic", ckpt_n=3, ckpt_k=4, train_steps=1,
    alphas=(0.0, 1.0), unit_ks=(1, 4), batch_size=4,
    # a lenient screen, so that localisation runs on the random-weight model too; not circular: a
    # random-weight model is right under every shift on almost no question, which empties the panel
    screen_margin=0.0, screen_level=0.5, screen_above_chance=False, circular=False,
    validate_gold="task",  # a random-weight model states no answer to anchor to
    why={"all": "every part end to end on a random-weight 3-layer model in seconds, with a lenient failure screen "
                "(margin 0, 50% interval, recognition not required above chance) and without the circular protocol "
                "so that localisation runs; the "
                "numbers mean nothing"},
)

DEMO = Profile(
    name="demo", model="smollm2",
    audit_tasks=PAPER_TASKS, audit_n=40, k=32,
    # issue 12's cells; GSM8K last: its 256-token answers make each route generation about
    # 8x an ARC-Challenge one (README: about 12 h for its 40 questions on a 2-core CPU)
    route_tasks=("arithmetic", "arc_challenge", "gsm8k"), route_n=40, route_k=32, route_batch_size=10,
    # routes of at least 27 of 30 blocks: unbounded random native/polar routes break
    # SmolLM2's answer format (README, routing), which would exclude every cell
    route_min_len=27,
    sweep_task="arc_challenge", sweep_n=40, sweep_k=8,
    screen_tasks=MC_TASKS, screen_n=64,
    ckpt_task="arithmetic", ckpt_n=64, ckpt_k=16, train_steps=10, ckpt_budget_k=128,
    opt_in=("6_validation",),
    why={
        "1_audit": "40 questions per task: the gap's 95% interval is about +-0.15 there; +-0.1 needs about 100 "
                   "(half-width 1.96*sqrt(g(1-g)/n) at a gap g near 0.3-0.5), 2.5x this part's cost",
        "2_routing": "arithmetic, ARC-Challenge and GSM8K, 40 questions per cell as issue 12 asks: each question "
                     "costs 3 spaces x 7 searches x K=32 route generations, the most expensive part on a CPU "
                     "(GSM8K's the most: 256-token answers); chunks of 10 questions, each a records part, and "
                     "a stopped chunk resumes from the run's journal",
        "3_temperature": "40 questions, K=8 (the paper's plain-sampling selection gap uses 8 samples)",
        "4_localisation": "64 questions per MC cell for the screen; localisation then runs on the cells that pass, "
                          "under the circular protocol (every cyclic shift of the options: 3-5x the rows)",
        "5_checkpoints": "the experiments/ recipes at their defaults (10 steps, 64 held-out questions, K=16); the "
                         "budget control samples 128 per question, so the source of gains is read up to K=128",
        "6_validation": "only with --parts 6_validation (about 15 minutes per task on this CPU): the quick validation "
                        "(the default plant and its null at 3 seeds), which reads recovery but cannot call a strength "
                        "detected (3 of 3 has a 95% Wilson lower bound of 0.44)",
    },
)

FULL = Profile(
    name="full", model="smollm2",
    audit_tasks=PAPER_TASKS, audit_n=100, k=32,
    route_tasks=("gsm8k", "arc_challenge", "arithmetic"), route_n=40, route_k=32, route_batch_size=40,
    route_min_len=27,  # as the demo's: unbounded routes break SmolLM2's answer format
    sweep_task="arc_challenge", sweep_n=100, sweep_k=8,
    screen_tasks=MC_TASKS, screen_n=300,
    ckpt_task="arithmetic", ckpt_n=200, ckpt_k=32, train_steps=30, ckpt_budget_k=256,
    validate_profile="full",
    why={
        "1_audit": "100 questions per task: the gap's 95% interval is narrower than +-0.1",
        "2_routing": "GSM8K, ARC-Challenge and arithmetic, 40 questions per cell, all three spaces (issue 12)",
        "3_temperature": "100 questions at K=8",
        "4_localisation": "300 questions per MC cell: failure sets large enough to split selection / held out",
        "5_checkpoints": "200 held-out questions at K=32, 30 training steps",
        "6_validation": "the full validation (five strengths, ten seeds) per localisation task at 300 questions: the "
                        "smallest planted effect this n detects, read beside each untestable or unreproduced row",
        "all": "sized for a GPU: cost grows about linearly in questions per part, so it is 2.5-25x the demo's "
               "measured per-part costs (README)",
    },
)

PROFILES = {p.name: p for p in (SMOKE, DEMO, FULL)}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]
