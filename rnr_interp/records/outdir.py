"""Output folders: what may become a run folder (`check_out_folder`: refused in one
line naming the problem, before anything is created), and making one so that a failed
start leaves nothing behind (`make_folder`, `remove_empty`)."""

from __future__ import annotations

import os
from pathlib import Path

from rnr_interp.records.schema import (
    ARTEFACTS_DIR, JOURNAL, LOCK, MANIFEST, RECORDS_DIR, RunFolderError, SUMMARY, TASK_FILE,
)

#: what a run writes into its folder
WRITTEN: tuple[str, ...] = (MANIFEST, SUMMARY, JOURNAL, RECORDS_DIR, ARTEFACTS_DIR, TASK_FILE)
#: how deep `check_out_folder` looks for this tool's folders inside an output folder
_OUT_DEPTH = 6


def check_out_folder(path: str | os.PathLike[str], option: str = "--out", marks: tuple[str, ...] | None = None) -> None:
    """Refuse, with one line naming the problem, a folder that cannot be a run folder:
    an existing file, a path under a file, a folder that cannot be created or written.
    Creates nothing, so commands call it before they start.

    With `marks` (the files that mark a folder as this tool's output: a run folder's
    manifest, a sweep's index, ...), an existing folder must also be this tool's: one
    holding a mark, or holding nothing but such folders and what a killed writer leaves
    (its lock, temp files, empty folders). Anything else is a user's folder, refused
    naming a file in it (first one the run would overwrite), so nothing of theirs is
    overwritten or mixed into a run."""
    root = Path(path)
    if str(path) == "":
        raise RunFolderError(f"{option} must name a folder, got the empty string")
    if root.exists() and not root.is_dir():
        raise RunFolderError(f"{option} {root} is a file, not a folder")
    existing = root
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise RunFolderError(f"{option} {root} is under a file ({existing})")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunFolderError(f"{option} {root}: {existing} is not writable")
    if marks is not None and root.is_dir() and (foreign := _not_ours(root, marks, _OUT_DEPTH)) is not None:
        held = foreign.relative_to(root)
        overwritten = f" ({held} would be overwritten)" if foreign.parent == root and foreign.name in WRITTEN else ""
        raise RunFolderError(
            f"{option} {root} holds {held} but no {' or '.join(marks)}: not a folder of this tool{overwritten}; "
            "use a new or empty folder, or a run folder of this tool to resume it")


def _not_ours(folder: Path, marks: tuple[str, ...], depth: int) -> Path | None:
    """The first entry of `folder` that makes it not this tool's (None: it is); names
    a run would write come first, so the message names what would be overwritten."""
    if any((folder / mark).is_file() for mark in marks):
        return None
    try:
        entries = sorted(folder.iterdir(), key=lambda p: (p.name not in WRITTEN, p.name))
    except OSError:
        return folder
    for entry in entries:
        if entry.name == LOCK or entry.name.endswith(".tmp"):
            continue  # what a killed writer leaves
        if entry.is_dir() and not entry.is_symlink() and depth > 0:
            found = _not_ours(entry, marks, depth - 1)
            if found is None:
                continue
            return found
        return entry
    return None


def make_folder(root: Path) -> list[Path]:
    """mkdir -p, returning the folders it created (deepest last) so a failed start can
    remove them again; OS errors become one-line RunFolderErrors."""
    check_out_folder(root, "run folder")
    created = []
    for folder in [*reversed(root.parents), root]:
        if not folder.exists():
            try:
                folder.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                remove_empty(created)
                raise RunFolderError(f"run folder {root}: cannot create {folder} ({exc.strerror})") from None
            created.append(folder)
    return created


def remove_empty(folders: list[Path]) -> None:
    """Remove `folders` (as `make_folder` returned them) where they are still empty."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            pass
