"""The journal of a batch in progress: one flushed JSON line per finished piece of
work, so a run killed inside a long chunk resumes from its last finished batch."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable


from rnr_interp.records.schema import RunFolderError, short_repr
from rnr_interp.records.files import first_line, fsync_dir, json_default, parse_json

class Journal:
    """Work in progress that is not yet a record part: one JSON object per line, each
    append flushed to disk before it returns, so that a run killed in the middle of a
    long batch (a routing chunk: hours on a CPU) resumes without redoing what it had
    done. The kill can tear the last line only: `read` leaves that torn tail out, and
    the next `append` (by the writer, who holds the run's lock) cuts it first. The
    writer clears the journal once the part it was building is written.

    With a `run_id` (a run's journal always has one), every line appended carries it
    and `read` refuses a line that names another run, so a journal copied from another
    run is never replayed into this one. Lines without one were written before lines
    carried it: the reader decides whether they are the run's (`unowned`). A journal
    that is a link is never written through (O_NOFOLLOW)."""

    def __init__(self, path: Path, run_id: str | None = None):
        self.path = Path(path)
        self.run_id = run_id

    def append(self, entries: Iterable[dict[str, Any]]) -> None:
        stamp = {"run_id": self.run_id} if self.run_id is not None else {}
        data = "".join(json.dumps({**e, **stamp}, default=json_default) + "\n" for e in entries).encode()
        if not data:
            return
        self._cut_torn_tail()
        with os.fdopen(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644), "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def _cut_torn_tail(self) -> None:
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return
        with os.fdopen(os.open(self.path, os.O_RDWR | os.O_NOFOLLOW), "r+b") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.seek(0)
                raw = f.read()
                f.truncate(raw.rfind(b"\n") + 1)

    def error(self, line: int, problem: str) -> RunFolderError:
        """The one-line refusal of a journal line (lines count from 1)."""
        return RunFolderError(f"{self.path}, line {line}: {problem}; move the file away to redo its work")

    def read(self) -> list[dict[str, Any]]:
        """The complete lines, each a JSON object (line n is entry n-1); a line that is
        not one, or names another run, raises RunFolderError naming file and line."""
        if not self.path.is_file():
            return []
        raw = self.path.read_bytes()
        entries = []
        for n, line in enumerate(raw[:raw.rfind(b"\n") + 1].splitlines(), 1):
            try:
                entry = parse_json(line)
            except (ValueError, UnicodeDecodeError) as err:
                raise self.error(n, f"not JSON ({first_line(err)})") from None
            if not isinstance(entry, dict):
                raise self.error(n, f"not a journal entry (a JSON {type(entry).__name__}, not an object)")
            owner = entry.get("run_id")
            if self.run_id is not None and owner is not None and owner != self.run_id:
                raise self.error(n, f"written by another run (run_id {short_repr(owner, 20)}, this run's is {self.run_id[:12]}...)")
            entries.append(entry)
        return entries

    @staticmethod
    def unowned(entry: dict[str, Any]) -> bool:
        """Whether a line read back names no run (written before lines carried one)."""
        return "run_id" not in entry

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)
