"""The typed summary of each analysis kind: the one definition of its ``summary.json``.

A run's summary is written and read through these classes (`RunDir.write_summary`,
`RunDir.read_summary`), so a key an analysis renames fails where it is written, and a
file that lacks a field (or holds one of the wrong type) is refused on read with one line
naming the field, instead of showing up as a missing section in a report.

Each class types its summary's top-level fields; nested blocks (intervals, per-cell
tables, chance baselines, ...) stay mappings and lists, as their analysis builds them. A
field without a default is written always (its value may be None where its type allows);
one with a None default is written only when it has a value. The file carries
`schema_version`; a summary without it (written before it was recorded, as the committed
run folders under experiments/runs) is version 0 and is read the same way when its
fields are valid.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, ClassVar, TypeVar

from rnr_interp.records.files import json_default
from rnr_interp.records.schema import RunFolderError

#: the version written now; 0 is a summary from before the version was recorded
SCHEMA_VERSION = 1
#: every analysis kind a run folder's config names, in the order the paper takes them
AUDIT, ROUTE, ROUTE_CELLS, TEMPERATURE_SWEEP = "audit", "route", "route_cells", "temperature_sweep"
FAILURES, SCREEN, REPAIR, STEER, UNITS, COMPARE = "failures", "screen", "repair", "steer", "units", "compare"
#: the known-answer validation: organisms planted in a model, the analyses run on them
VALIDATE = "validate"
#: the localisation kinds that sweep, steer or silence inside a cohort's chosen block
LOCALISATION_SWEEPS = (REPAIR, STEER, UNITS)

Json = Mapping[str, Any]
S = TypeVar("S", bound="Summary")


class SummaryError(RunFolderError):
    """A summary that does not fit its kind's definition: one line naming the field."""


@dataclass(frozen=True, kw_only=True)
class Summary:
    """What every summary holds besides its kind's own fields."""

    KIND: ClassVar[str] = ""
    schema_version: int = SCHEMA_VERSION
    #: the data rows the task skipped as invalid (`--on-invalid skip`)
    skipped_rows: list[Json] | None = None
    #: `rnr regrade`: the run rewritten (from) and its records parts then
    regraded: Json | None = None
    #: written from a run that holds fewer questions than its task (questions_done, questions)
    unfinished: Json | None = None
    warnings: list[str] | None = None

    @property
    def kind(self) -> str:
        return self.KIND

    def to_json(self) -> dict[str, Any]:
        """The summary as written: `kind` first, then every field with a value (a field
        that defaults to None only when it is not None)."""
        out: dict[str, Any] = {"kind": self.KIND}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None or f.default is not None:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls: type[S], data: Any, where: str = "summary") -> S:
        """The summary in `data` (a summary.json's content), checked field by field:
        SummaryError naming `where` and the field when one is missing, unknown or of
        the wrong type. No `schema_version`: version 0."""
        if not isinstance(data, Mapping):
            raise SummaryError(f"{where}: not a run summary (expected a JSON object, got {type(data).__name__})")
        data = dict(data)
        kind = data.pop("kind", cls.KIND)
        if kind != cls.KIND:
            raise SummaryError(f"{where}: field 'kind' is {kind!r}, expected {cls.KIND!r}")
        version = data.setdefault("schema_version", 0)  # none: 0, as in all four runs under experiments/runs
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise SummaryError(f"{where}: field 'schema_version' is {version}, newer than this version reads "
                               f"({SCHEMA_VERSION}); upgrade rnr_interp")
        hints = field_types(cls)
        unknown = sorted(set(data) - set(hints))
        if unknown:
            raise SummaryError(f"{where}: unknown field {unknown[0]!r} in the {cls.KIND} summary")
        for f in fields(cls):
            if f.name not in data:
                if f.default is None or f.name == "schema_version":
                    continue
                raise SummaryError(f"{where}: field {f.name!r} is missing from the {cls.KIND} summary")
            if not _conforms(data[f.name], hints[f.name]):
                raise SummaryError(f"{where}: field {f.name!r} of the {cls.KIND} summary should be "
                                   f"{type_name(hints[f.name])}, got {_short(data[f.name])}")
        return cls(**data)

    @classmethod
    def of(cls: type[S], values: Mapping[str, Any], where: str = "summary") -> S:
        """The summary of an analysis's computed values (numpy numbers and arrays turned
        into JSON's), checked as a file's would be."""
        plain = json.loads(json.dumps(dict(values), default=json_default))
        return cls.from_json({**plain, "schema_version": SCHEMA_VERSION}, where)

    def but(self: S, **changes: Any) -> S:
        """A copy with `changes`, checked again."""
        return type(self).from_json({**self.to_json(), **changes}, f"{self.KIND} summary")


# -- the kinds ------------------------------------------------------------------------


class Graded:
    """A summary under a headline grading (`grading`; flexible in summaries from before
    it was recorded) with the other grading's block beside (`strict`, `flexible`)."""

    grading: str | None
    strict: Json | None
    flexible: Json | None

    @property
    def headline(self) -> str:
        return self.grading or "flexible"

    def beside(self) -> str | None:
        """The other grading, when the summary carries its block."""
        return next((g for g in ("strict", "flexible") if g != self.headline and self.graded(g)), None)

    def graded(self, grading: str) -> Json | None:
        """One grading's block (its numbers as the kind computes them), or None."""
        return {"strict": self.strict, "flexible": self.flexible}.get(grading)


@dataclass(frozen=True, kw_only=True)
class AuditSummary(Graded, Summary):
    """`analyses.audit.summarize`: D, O_K and their gap under the headline grading, the
    other grading's numbers beside, the chance null, pass@k and the votes."""

    KIND: ClassVar[str] = AUDIT
    n_questions: int
    k: int | None
    D: float
    O_K: float
    gap: float
    D_ci: list[float]
    O_K_ci: list[float]
    gap_ci: list[float]
    probe: str | None = None
    ci: str | None = None
    level: float | None = None
    grading: str | None = None
    model: str | None = None
    task: str | None = None
    temperature: float | None = None
    pass_at_k: Json | None = None
    #: each grading's D, O_K, gap, intervals and null (`summary[grading]`)
    strict: Json | None = None
    flexible: Json | None = None
    null: Json | None = None
    unparsed_rate: float | None = None
    unfinished_rate: Mapping[str, float] | None = None
    vote_at_k: Json | None = None
    majority: Json | None = None
    weighted_majority: Json | None = None
    chance: Json | None = None
    circular: Json | None = None



@dataclass(frozen=True, kw_only=True)
class RouteSummary(Graded, Summary):
    """`analyses.routing` summary: per cell (nested, as the routing audit builds it)
    oracle@K, the searches' differences and the selectors; across kept cells the oracles
    and selectors; the temperature probe's selection gap."""

    KIND: ClassVar[str] = ROUTE
    model: str
    task: str
    k: int
    budget: int
    n_questions: int
    deployed: float
    deployed_ci: list[float]
    cells: Mapping[str, Json]
    temperature: Json
    excluded_cells: list[str]
    oracle_at_k: Mapping[str, float]
    selectors: Mapping[str, Json]
    grading: str | None = None
    proposals: Json | None = None
    exclusion: Json | None = None
    strict: Json | None = None
    flexible: Json | None = None
    null: Json | None = None
    unfinished_rate: Mapping[str, float] | None = None
    #: parts left out and why (e.g. the chance nulls where the task cannot be reloaded)
    missing: list[str] | None = None
    #: `rnr route-summary` of a run in progress: of, questions_done, questions_total
    snapshot: Json | None = None
    #: per space, where the gains are (`analyses.routing.summary.layers_summary`): top
    #: {layer, action, gain, gain_ci, null_gain, above_chance} and the ranked few
    layers: Mapping[str, Json] | None = None


@dataclass(frozen=True, kw_only=True)
class RouteCellsSummary(Summary):
    """`routing.cells.write_route_cells`: the cross-cell tables' headline rows."""

    KIND: ClassVar[str] = ROUTE_CELLS
    runs: list[str]
    #: overlapping runs' spaces that were not counted (run, space, overlaps, shared_questions)
    left_out: list[Json] = field(default_factory=list)
    clean_cells: int
    collapsed_cells: list[str]
    model_task: list[Json]
    counts: list[Json]
    selectors: list[Json]


@dataclass(frozen=True, kw_only=True)
class TemperatureSweepSummary(Summary):
    """`sweep.run_temperature_sweep`: one row per temperature (table temperature_sweep)."""

    KIND: ClassVar[str] = TEMPERATURE_SWEEP
    model: str
    task: str
    k: int
    grading: str
    rows: list[Json]


@dataclass(frozen=True, kw_only=True)
class ScreenSummary(Summary):
    """`localise.repair.write_screen`: the criterion and each cell's line."""

    KIND: ClassVar[str] = SCREEN
    criterion: str
    margin: float
    level: float
    n_cells: int
    n_failure_cells: int
    cells: list[Json]


@dataclass(frozen=True, kw_only=True)
class CohortSummary(Summary):
    """What every localisation summary opens with (`localise.cohort.cohort_summary`):
    the cohort's sizes, criteria, split and recognition, and the multiple-choice
    readings (`readings.multiple_choice_readings`)."""

    model: str
    task: str
    n_questions: int
    n_recognised: int | None = None
    deployed_accuracy: float | None = None
    n_failure: int
    n_panel: int
    failure_criterion: str | None = None
    panel_criterion: str | None = None
    split: Json | None = None
    failure_empty_reason: str | None = None
    circular: Json | None = None
    letter_bias: Json | None = None
    recognition_accuracy: Mapping[str, float] | None = None
    chance: Json | None = None
    answer_changes: Json | None = None
    permutation_control: Json | None = None


@dataclass(frozen=True, kw_only=True)
class FailuresSummary(CohortSummary):
    """`localise.repair.run_failures`: the cohort and the cell's screen line."""

    KIND: ClassVar[str] = FAILURES
    readout: str
    screen: Json | None = None


@dataclass(frozen=True, kw_only=True)
class RepairSummary(CohortSummary):
    """`localise.repair.run_repair`: the silencing sweep, the chosen block with its
    held-out rates and same-layer controls, each component's own best block."""

    KIND: ClassVar[str] = REPAIR
    readout: str | None = None
    sweep: str | None = None
    #: how each block was silenced (`interventions.ABLATION_MODES`): the paper's "zero", or
    #: "mean"; None in runs from before there was a choice (zero)
    ablation: str | None = None
    #: units silenced per MLP block (`run_repair(units=K)`): its K units most along its own failure
    #: direction; None: the whole block (the paper's)
    units: int | None = None
    #: where each block's failure direction was read, for its units and the tie rule
    #: (`run_repair(read_at=...)`): "answer", where each deployed reply's answer starts; None: the prompt's end
    read_at: str | None = None
    screen: Json | None = None
    choice_rule: str | None = None
    chosen: Json | None = None
    at_chosen_layer: Mapping[str, Json | None] | None = None
    own_best: Mapping[str, Json | None] | None = None
    best: Mapping[str, Json | None] | None = None
    best_all_questions: Mapping[str, Json | None] | None = None
    table: list[Json] | None = None


@dataclass(frozen=True, kw_only=True)
class ChosenBlockSummary(CohortSummary):
    """What steering and units share: the block they work at (or why they were skipped,
    the cohort leaving a part empty) and their table's rows."""

    skipped: str | None = None
    layer: int | None = None
    block_choice: str | None = None
    scored_on: str | None = None
    table: list[Json] | None = None


@dataclass(frozen=True, kw_only=True)
class SteerSummary(ChosenBlockSummary):
    """`localise.steering.run_steer`: reciprocal steering at the chosen block."""

    KIND: ClassVar[str] = STEER
    component: str | None = None
    alpha_unit: str | None = None
    alpha_unit_words: str | None = None
    v_norm: float | None = None
    residual_rms: float | None = None
    steered_norm_per_alpha: float | None = None
    #: the RMS norm of the block's own write, the scale of alpha_unit "write" (only in that unit)
    write_rms: float | None = None
    #: the answers the failure set's selection part gave: an induced answer among them takes the failure's form
    failure_answers: list[str] | None = None
    #: where the vector was added: at every position, or at the prompt's last one
    steer_at: str | None = None
    #: the same sweep along a random direction as long as the steered vector (seed, norm, cosine with v, table)
    random_control: Json | None = None
    #: the block's write clamped to the panel's mean along v, within the failures' span and within a random span
    #: of its rank, on the held-out failures (rescue) and panel (damage): rank, spectrum, energy, values along v,
    #: seed, at, table
    clamp_control: Json | None = None


@dataclass(frozen=True, kw_only=True)
class UnitsSummary(ChosenBlockSummary):
    """`localise.steering.run_units`: top-k units against random sets at the chosen block."""

    KIND: ClassVar[str] = UNITS
    whole_block_repair: float | None = None
    random_draws: int | None = None
    spread: list[Json] | None = None


@dataclass(frozen=True, kw_only=True)
class CompareSummary(Graded, Summary):
    """`analyses.checkpoints.compare_runs`: base vs trained transitions, paired tests,
    propensity bins, the shared-prompt retention and the budget control."""

    KIND: ClassVar[str] = COMPARE
    base_model: str | None
    trained_model: str | None
    task: str | None
    k: int
    stats: Json
    grading: str | None = None
    temperature: float | None = None
    deployed: Json | None = None
    prompt_formats: Json | None = None
    #: `checkpoints.counts`: the transition categories and where the gains came from
    n_questions: int
    gained_from: Mapping[str, int]
    realized: Mapping[str, int] | None = None
    reachable: Mapping[str, int] | None = None
    crosstab: Json | None = None
    propensity_bins: list[Any] | None = None
    propensity: list[Json] | None = None
    shared_prompt: Json | None = None
    budget_control: Json | None = None
    strict: Json | None = None
    flexible: Json | None = None
    chance: Json | None = None


@dataclass(frozen=True, kw_only=True)
class ValidateSummary(Summary):
    """`analyses.validate.run_validate`: per planted kind (and per analysis) the share of
    planted organisms recovered, with its interval, and the nulls' false-positive rate."""

    KIND: ClassVar[str] = VALIDATE
    model: str
    task: str
    n_questions: int
    profile: str
    profile_why: str | None = None
    #: "base": golds are the base model's own deployed answers (`analyses.anchor`);
    #: "task": the task's golds
    gold: str = "task"
    #: the audits' sampling temperature (the gap and pair kinds; None: a run from before it was set)
    temperature: float | None = None
    #: how the repair sweeps silenced a block (`RepairSummary.ablation`; None: zero, a run from before)
    ablation: str | None = None
    #: what "right" was for every analysis (None: strict, a run from before)
    grading: str | None = None
    #: where the steer runs added the vector (`SteerSummary.steer_at`; None: every position)
    steer_at: str | None = None
    #: the MLP sweeps silenced each block's top K units alone (`RepairSummary.units`; None: whole blocks)
    units: int | None = None
    #: the block the kinds planted at a layer were planted at (None: the block each seed draws)
    layer: int | None = None
    #: how many units the units kind planted (None: its default)
    plant_units: int | None = None
    #: where the units and steer runs read the block (None: the prompt's end)
    read_at: str | None = None
    #: the steer runs' alpha grid and its unit (None: the unit's default grid; rms)
    alphas: list[float] | None = None
    alpha_unit: str | None = None
    #: the steer runs also clamped the failures' span, scored as steer:clamp (None: they did not)
    clamp_control: bool | None = None
    #: kind -> {rate, ci, n, n_seeds, null_false_positive_rate, null_ci, n_null, n_null_seeds}: n counts
    #: distinct organisms (two seeds that drew the same weights are one); kinds with a repair
    #: sweep also n_without_failure (planted organisms whose repair run found no failure set);
    #: a kind some of whose cells the model refused also not_planted: [{strength, seed, why}]
    recovery: Mapping[str, Json]
    by_analysis: Mapping[str, Json]


#: kind -> its summary's class, the one place a kind's summary type is looked up
#: (`report.kinds.register` adds an analysis's own)
SUMMARY_TYPES: dict[str, type[Summary]] = {cls.KIND: cls for cls in (
    AuditSummary, RouteSummary, RouteCellsSummary, TemperatureSweepSummary, FailuresSummary, ScreenSummary,
    RepairSummary, SteerSummary, UnitsSummary, CompareSummary, ValidateSummary)}


def register_summary(cls: type[Summary]) -> type[Summary]:
    """Add a kind's summary class (a frozen, keyword-only dataclass subclassing
    `Summary`, its `KIND` new); ValueError when the kind has one."""
    if not cls.KIND or cls.KIND in SUMMARY_TYPES:
        raise ValueError(f"summary kind {cls.KIND!r} is {'taken' if cls.KIND else 'empty'}")
    for name, hint in field_types(cls).items():
        if not _checkable(hint):  # here, not on the first read
            raise TypeError(f"summary field {cls.KIND}.{name}: type {hint!r} is not one summaries check "
                            "(int, float, str, bool, None, Any, lists, mappings and unions of them)")
    SUMMARY_TYPES[cls.KIND] = cls
    return cls


def summary_type(kind: Any, where: str = "summary") -> type[Summary]:
    """The summary class of `kind`; SummaryError naming the kinds there are."""
    if kind not in SUMMARY_TYPES:
        raise SummaryError(f"{where}: unknown analysis kind {kind!r} (one of {', '.join(SUMMARY_TYPES)})")
    return SUMMARY_TYPES[kind]


def parse_summary(data: Any, kind: str | None = None, where: str = "summary") -> Summary:
    """The typed summary in `data`, of `kind` (the run config's) or of the kind the
    summary names; they must agree when both are given."""
    named = data.get("kind") if isinstance(data, Mapping) else None
    return summary_type(kind if kind is not None else named, where).from_json(data, where)


# -- checking a value against a field's type ------------------------------------------


@cache
def field_types(cls: type) -> dict[str, Any]:
    """A summary class's field name -> type."""
    return {f.name: hint for f in fields(cls) for name, hint in typing.get_type_hints(cls).items() if name == f.name}


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a field's type (shallow below lists and mappings, one
    level of element types checked)."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value) if args else isinstance(value, list)
    if origin in (Mapping, dict) or hint in (Mapping, dict):
        return isinstance(value, dict) and (not args or all(_conforms(v, args[1]) for v in value.values()))
    raise TypeError(f"summary field type {hint!r} is not one the summaries use")


def _checkable(hint: Any) -> bool:
    if hint is Any or hint in (int, float, str, bool, type(None), list, dict, Mapping):
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType, list, dict, Mapping):
        return all(_checkable(a) for a in typing.get_args(hint))
    return False


def type_name(hint: Any) -> str:
    """A field type in words, for messages and docs/records.md."""
    if hint is Any:
        return "any JSON value"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    origin = typing.get_origin(hint)
    if origin is list:
        return "a list"
    if origin in (Mapping, dict):
        return "an object"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(hint, str(hint))


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."
