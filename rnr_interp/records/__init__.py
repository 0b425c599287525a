"""Run folders: candidate records in Parquet parts, a manifest, resumable writes.

A run folder looks like::

    run/
      manifest.json        config given by the caller + created, versions, config_hash
      summary.json         written by the analysis when it finishes (records.summaries: one typed class per kind)
      task.json            the questions (and lm-eval grading settings) the run read
      records/part-00000.parquet, part-00001.parquet, ...
      artefacts/NAME.parquet, NAME.json   named extra tables and JSON (failure sets, ...)

Every candidate is one row (`RECORD_SCHEMA`). A part holds complete (question, probe)
groups, so the questions present in the parts are exactly the questions done, and a
resumed run skips them. Every file is written to a `*.tmp` in its final folder and then
moved into place with `os.replace`, which is atomic on POSIX: a kill leaves at most a
stray `*.tmp`, which readers never look at and the next writer's open removes.

One writer per run folder: `RunDir.create` takes an exclusive `flock` on `run/.lock`
(which names the holder: pid, host, start time, command) and keeps it while any `RunDir`
of this process for the folder is alive; a second process is refused with the holder's
name. The kernel drops the lock of a killed process, so a `.lock` left behind by one is
stale and the next writer takes it over. Readers take no lock and may open a run that is
still being written; whatever writes into a run (a regrade, a report) takes it first.
Every records part's sha256 is in the manifest (`parts_sha256`, written before the part)
and `task.json`'s too: a file that no longer matches is refused naming it. Nothing is
written through a link (O_NOFOLLOW) or into a `records/` resolving outside the run. Unreadable files (garbage JSON, a manifest without a config,
truncated or foreign Parquet parts) raise `RunFolderError`, one line naming the file.
"""

# The package's API, importable from `rnr_interp.records` (each name is defined in the module it comes from).
from rnr_interp.records.schema import (
    ARTEFACTS_DIR, DEFAULT_GRADING, DEPLOYED, GRADINGS, JOURNAL, LATER_COLUMNS, LEGACY_GRADING, LOCK, MANIFEST,
    ProbeLabel, RECORDS_DIR, RECORD_COLUMNS, RECORD_KEY, RECORD_SCHEMA, RunFolderError, RunLockedError, SUMMARY, TASK_FILE,
    short_repr,
)
from rnr_interp.records.files import (
    JSONTooDeepError, MAX_JSON_DEPTH, first_line, fsync_dir, json_default, parquet_bytes, parse_json, read_json_file,
    read_parquet, remove_temp_files, write_bytes_atomic, write_json_atomic, write_parquet_atomic, write_text_atomic,
)
from rnr_interp.records.journal import Journal
from rnr_interp.records.config import (
    ConfigMismatchError, PROVENANCE_KEYS, UNHASHED_KEYS, comparable, comparable_hash, config_diff, config_grading,
    config_hash, run_environment, lookup, normalise, stable_key, package_versions,
)
from rnr_interp.records.lock import WriterLock, writer_lock
from rnr_interp.records.summaries import (
    AUDIT, COMPARE, FAILURES, LOCALISATION_SWEEPS, REPAIR, ROUTE, ROUTE_CELLS, SCHEMA_VERSION, SCREEN, STEER,
    SUMMARY_TYPES, TEMPERATURE_SWEEP, UNITS, AuditSummary, CohortSummary, CompareSummary, FailuresSummary,
    RepairSummary, RouteCellsSummary, RouteSummary, ScreenSummary, SteerSummary, Summary, SummaryError,
    TemperatureSweepSummary, UnitsSummary, VALIDATE, ValidateSummary, parse_summary, register_summary, summary_type,
)
from rnr_interp.records.outdir import WRITTEN, check_out_folder
from rnr_interp.records.rundir import RunDir, file_sha256, load_runs
