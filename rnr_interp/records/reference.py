"""docs/records.md, generated from the code that defines a run folder: the file names,
the record columns (`schema.COLUMNS`, the optional `schema.TOKEN_COLUMN_SPECS`), the
records version, the probe labels and each analysis kind's summary fields (`summaries`). `python -m rnr_interp.records.reference > docs/records.md`
writes it; tests/test_records_reference.py fails when the two differ."""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields

import pyarrow as pa

from rnr_interp.records.schema import (
    ARTEFACTS_DIR, COLUMNS, DEFAULT_GRADING, GRADINGS, JOURNAL, LOCK, MANIFEST, RECORD_KEY, RECORDS_DIR,
    RECORDS_VERSION, RECORDS_VERSION_KEY, SUMMARY, TASK_FILE, TOKEN_COLUMN_SPECS, ProbeLabel,
)
from rnr_interp.records.summaries import SCHEMA_VERSION, SUMMARY_TYPES, Summary, field_types, type_name


def records_reference() -> str:
    """The text of docs/records.md."""
    return "\n".join([*_folder(), *_columns(), *_token_columns(), *_version(), *_probes(), *_summaries()]).rstrip() + "\n"


def _folder() -> list[str]:
    return [
        "# Run folders and records",
        "",
        "Generated from `rnr_interp/records/` by `python -m rnr_interp.records.reference > docs/records.md`;",
        "a test fails when this page and the code differ.",
        "",
        "```",
        "RUN/",
        f"  {MANIFEST:<20} the run's config (its `kind` names the analysis), versions, config hash, record columns",
        f"  {SUMMARY:<20} the analysis's summary when it finishes (below: one typed class per kind)",
        f"  {TASK_FILE:<20} the questions and grading settings as the run read them (checksum in the manifest)",
        f"  {RECORDS_DIR}/part-NNNNN.parquet  the records, in parts of complete (question, probe) groups",
        f"  {ARTEFACTS_DIR}/NAME.parquet|json  named tables and JSON (failure sets, route tables, ...)",
        f"  {JOURNAL:<20} work in progress not yet in a part",
        f"  {LOCK:<20} the writer's lock (who holds it)",
        "```",
        "",
    ]


def _columns() -> list[str]:
    lines = [f"## Records (layout version {RECORDS_VERSION})", "",
             "One row per candidate. A row is identified by " + ", ".join(f"`{c}`" for c in RECORD_KEY)
             + f"; `correct` is the headline grading's grade (one of {', '.join(GRADINGS)}; "
             f"{DEFAULT_GRADING} for a new run).", ""]
    return lines + _table(COLUMNS) + [""]


def _table(columns: tuple[tuple[str, pa.DataType, bool, str], ...]) -> list[str]:
    return ["| column | type | null | what it holds |", "|---|---|---|---|",
            *(f"| `{name}` | {kind} | {'yes' if nullable else 'no'} | {doc} |" for name, kind, nullable, doc in columns)]


def _token_columns() -> list[str]:
    return ["### Per-token columns (`--save-logprobs`)", "",
            "A run started with `--save-logprobs` (its config holds `save_logprobs: true`) has these two columns "
            "after the ones above; a run without it has neither, and its parts, config and run id are what they "
            "were before the option existed. Both engines fill them.", "", *_table(TOKEN_COLUMN_SPECS), ""]


def _version() -> list[str]:
    return ["### Version", "",
            f"A run's `{MANIFEST}` records the layout it was written with as `{RECORDS_VERSION_KEY}` "
            f"(this code writes {RECORDS_VERSION}; a manifest without it comes from before it was recorded and is read "
            "as its parts say). A run whose version is newer than the reader's is refused with one line naming it. "
            "`record_columns` lists the run's columns, the per-token ones included. "
            "Of the shapes earlier 0.1 versions wrote, this code reads those the runs kept under "
            "`experiments/runs` have (no records version, parts without checksums, no `comparable_hash`, no "
            "`grading` or strict grades); other folders of earlier versions are refused with one line saying to "
            "rerun them.", ""]


def _probes() -> list[str]:
    doc = inspect.cleandoc(ProbeLabel.__doc__ or "")
    return ["## Probe labels (the `probe` column)", "", doc, ""]


def _summaries() -> list[str]:
    lines = [f"## Summaries (schema version {SCHEMA_VERSION})", "",
             "`summary.json` holds `kind`, `schema_version` (missing: version 0, read the same way) and the fields of "
             "its kind's class in `rnr_interp/records/summaries.py`. A field marked *always* is written by every "
             "run; the others only when they have a value. Nested values are described in the class.", ""]
    base = {f.name for f in fields(Summary)}
    for kind, cls in SUMMARY_TYPES.items():
        hints = field_types(cls)
        own = [f for f in fields(cls) if f.name not in base]
        lines += [f"### `{kind}` ({cls.__name__})", "", inspect.cleandoc(cls.__doc__ or ""), "",
                  ", ".join(f"`{f.name}` ({type_name(hints[f.name])}{', *always*' if _always(f) else ''})"
                            for f in own), ""]
    shared = ", ".join(f"`{f.name}`" for f in fields(Summary) if f.name != "schema_version")
    return lines + [f"Every kind may also carry {shared}.", ""]


def _always(f) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


if __name__ == "__main__":
    print(records_reference(), end="")
