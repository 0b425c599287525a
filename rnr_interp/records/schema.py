"""What a run folder holds: its file names, the record schema and columns, the
gradings, the probe labels (`ProbeLabel`), and the errors a folder raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa



MANIFEST = "manifest.json"
#: work in progress not yet in a record part (`Journal`)
JOURNAL = "journal.jsonl"
SUMMARY = "summary.json"
#: the run's questions and grading settings as the run read them (`RunDir.create`'s
#: `task.stored`): what readers grade and show, so no task config is rendered again
TASK_FILE = "task.json"
RECORDS_DIR = "records"
ARTEFACTS_DIR = "artefacts"
LOCK = ".lock"

#: the version of the record layout: 1 before both grades were recorded (no
#: correct_strict, correct_flexible; `read_records` reads such parts), 2 since
RECORDS_VERSION = 2
#: each record column: (name, Arrow type, nullable, what it holds); docs/records.md is
#: generated from this table (`records.reference`)
COLUMNS: tuple[tuple[str, pa.DataType, bool, str], ...] = (
    ("run_id", pa.string(), False, "the run that wrote the row (its manifest's run id)"),
    ("model", pa.string(), False, "the model spec"),
    ("task", pa.string(), False, "the task's name"),
    ("question_id", pa.string(), False, "the question's id in its task"),
    ("probe", pa.string(), False, 'a `ProbeLabel`: "deployed", "temperature", "ablate:mlp:3", "native:mcts", ...'),
    ("candidate", pa.int64(), False, "index of the candidate within its probe for this question"),
    ("intervention", pa.string(), False, 'JSON id of the intervention set or route; "" for none'),
    ("seed", pa.int64(), False, "the candidate's own seed"),
    ("text", pa.string(), False, "the generated text"),
    ("extracted", pa.string(), True, "the answer read from the text; null when none parses out of it"),
    ("gold", pa.string(), False, "the gold answer"),
    ("correct", pa.bool_(), False, "the grade the run's headline uses (its manifest's `grading`): one of the two below"),
    ("logprob", pa.float64(), False, "sum of the generated tokens' log-probabilities"),
    ("n_tokens", pa.int64(), False, "generated tokens"),
    ("finish", pa.string(), False, '"stop" or "length" (cut by the token limit)'),
    # parts written before both grades were recorded lack the two below: `read_records`
    # fills `correct_flexible` from `correct` (then the only rule) and leaves
    # `correct_strict` null (`grading.regrade` reads it from the text)
    ("correct_strict", pa.bool_(), True, "the strict grade (docs/grading.md); null in parts of version 1"),
    ("correct_flexible", pa.bool_(), True, "the flexible grade; `correct` in parts of version 1"),
)
RECORD_SCHEMA = pa.schema([pa.field(name, kind, nullable=nullable) for name, kind, nullable, _ in COLUMNS])
RECORD_COLUMNS: tuple[str, ...] = tuple(RECORD_SCHEMA.names)
#: per-token columns, after COLUMNS, in the parts of a run that asked for them
#: (`--save-logprobs`: its config's `save_logprobs`); other runs' parts stay as they were
TOKEN_COLUMN_SPECS: tuple[tuple[str, pa.DataType, bool, str], ...] = (
    ("token_ids", pa.list_(pa.int64()), True,
     "the generated token ids, without a closing stop token (`n_tokens` of them); null in rows that generate nothing"),
    ("token_logprobs", pa.list_(pa.float64()), True,
     "each generated token's log-probability (the measure of `logprob`, which is their sum)"),
)
TOKEN_FIELDS: tuple[pa.Field, ...] = tuple(pa.field(name, kind, nullable=nullable)
                                           for name, kind, nullable, _ in TOKEN_COLUMN_SPECS)
TOKEN_COLUMNS: tuple[str, ...] = tuple(f.name for f in TOKEN_FIELDS)
TOKEN_RECORD_SCHEMA = pa.schema([*RECORD_SCHEMA, *TOKEN_FIELDS])
#: the manifest entry holding the RECORDS_VERSION a run was written with (none: made
#: before it was recorded, read as the parts say); a newer one than this code's is refused
RECORDS_VERSION_KEY = "records_version"


def record_schema(tokens: bool) -> pa.Schema:
    """The schema of a run's parts: with the per-token columns or without."""
    return TOKEN_RECORD_SCHEMA if tokens else RECORD_SCHEMA


#: columns that parts written before them lack
LATER_COLUMNS: tuple[str, ...] = ("correct_strict", "correct_flexible")

#: the two gradings of a candidate (docs/grading.md)
GRADINGS: tuple[str, ...] = ("strict", "flexible")
#: the headline grading of a new run
DEFAULT_GRADING = "strict"
#: the headline grading of a run whose config records none: every run made before both
#: grades were recorded was graded by the flexible rule alone
LEGACY_GRADING = "flexible"
#: what identifies a row; read_records drops later duplicates of it
RECORD_KEY: tuple[str, ...] = ("question_id", "probe", "candidate", "intervention")


#: the `probe` value of the deployed candidate
DEPLOYED = "deployed"


@dataclass(frozen=True)
class ProbeLabel:
    """A value of the records' `probe` column: which probe produced a candidate. Built
    and parsed here only, so every module agrees on the formats:

    - ``deployed``: the deployed (greedy unless configured) candidate;
    - ``NAME``: K samples of a sampling probe (`sampling.Probe.name`, e.g. ``temperature``);
    - ``ablate:COMPONENT:LAYER``: the deployed decoding with one block silenced;
    - ``steer:rescue|induction:ALPHA``: the deployed decoding steered along v;
    - ``units:top:K`` / ``units:random:K:DRAW``: the deployed decoding with K MLP units
      silenced (the top K, or random draw DRAW of K);
    - ``SPACE:METHOD``: the routes a search evaluated, METHOD one of random,
      random_matched (random routes at the searches' distances), mcts, hill_climb,
      genetic (oracle reward) or mcts_blind, hill_climb_blind, genetic_blind (the
      answer-blind confidence reward);
    - ``rotated:SHIFT:LABEL``: probe LABEL (deployed, ablate, steer) asked with each
      question's options rotated by SHIFT positions (`tasks.rotate_options`), the
      letter-permutation control;
    - ``verify:LABEL``: self-verification of the answers of probe LABEL (a sampling or
      route probe): one row per distinct answer, `extracted` the answer, `logprob` the
      model's log P(yes) - log P(no) when asked whether it is correct, `correct` its
      grade, `text` "" and `n_tokens` 0 (nothing is generated). Stored so that the
      self-verification selector recomputes from the records alone.
    """

    kind: str  # "deployed" | "sample" | "ablate" | "steer" | "units" | "route" | "rotated" | "verify"
    parts: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.kind == "deployed":
            return DEPLOYED
        if self.kind in ("sample", "route"):
            return ":".join(self.parts)
        return ":".join((self.kind, *self.parts))

    @classmethod
    def deployed(cls) -> "ProbeLabel":
        return cls("deployed")

    @classmethod
    def sample(cls, name: str) -> "ProbeLabel":
        return cls("sample", (name,))

    @classmethod
    def ablate(cls, component: str, layer: int) -> "ProbeLabel":
        return cls("ablate", (component, str(layer)))

    @classmethod
    def steer(cls, direction: str, alpha: float) -> "ProbeLabel":
        return cls("steer", (direction, f"{alpha:g}"))

    @classmethod
    def units(cls, selection: str, k: int, draw: int | None = None) -> "ProbeLabel":
        return cls("units", (selection, str(k)) if draw is None else (selection, str(k), str(draw)))

    @classmethod
    def route(cls, space: str, method: str) -> "ProbeLabel":
        return cls("route", (space, method))

    @classmethod
    def rotated(cls, label: "ProbeLabel", shift: int) -> "ProbeLabel":
        return cls("rotated", (str(shift), *str(label).split(":")))

    @classmethod
    def verify(cls, label: "ProbeLabel") -> "ProbeLabel":
        return cls("verify", tuple(str(label).split(":")))

    @classmethod
    def parse(cls, text: str) -> "ProbeLabel":
        if text == DEPLOYED:
            return cls.deployed()
        head, *rest = text.split(":")
        if head == "verify" and rest and cls.parse(":".join(rest)).kind in ("sample", "route"):
            return cls("verify", tuple(rest))
        if head == "rotated" and len(rest) >= 2 and rest[0].lstrip("-").isdigit() \
                and cls.parse(":".join(rest[1:])).kind != "rotated":
            return cls("rotated", tuple(rest))
        if head in ("ablate", "steer", "units") and len(rest) == 2 or head == "units" and len(rest) == 3:
            return cls(head, tuple(rest))
        if len(rest) == 1:
            return cls("route", (head, rest[0]))
        if not rest:
            return cls.sample(head)
        raise ValueError(f"unrecognised probe label {text!r}")


class RunFolderError(ValueError):
    """A run folder, or one of its files, that cannot be used as one; the message is one
    line naming the path and the problem."""


class RunLockedError(RunFolderError):
    """Another live process holds the run folder's writer lock."""


def short_repr(value: Any, limit: int = 60) -> str:
    """repr clipped to `limit` characters, for one-line messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
