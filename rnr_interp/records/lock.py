"""The writer lock: one process writes a run folder at a time (an `flock` on
`run/.lock` that names its holder)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
import weakref
from datetime import datetime, timezone
from pathlib import Path


from rnr_interp.records.schema import LOCK, RunFolderError, RunLockedError

# -- the writer lock ----------------------------------------------------------------


_NO_DETAILS = "a process that left no details"


def _holder_text(raw: bytes) -> str:
    try:
        h = json.loads(raw.decode())
        return f"pid {h['pid']} on {h['host']} since {h['started']} ({h['command']})"
    except (ValueError, KeyError, TypeError):
        return _NO_DETAILS


def _read_holder(fd: int) -> str:
    """Who holds the lock on `fd`. A holder writes its details just after taking the
    flock, so a racing reader can find the file still empty: it looks again for up to a
    second before saying the holder left none."""
    for _ in range(20):
        raw = os.pread(fd, 4096, 0)
        if raw.strip():
            text = _holder_text(raw)
            if text != _NO_DETAILS:
                return text
        time.sleep(0.05)
    return _holder_text(os.pread(fd, 4096, 0))


class WriterLock:
    """An exclusive flock on `folder/.lock`, shared by every RunDir of this process for
    the folder (see `writer_lock`) and released, its file removed, when the last of them
    is gone. A lock file whose flock nobody holds was left by a killed process: it is
    taken over (`stale_holder` keeps what it said)."""

    def __init__(self, folder: Path):
        self.path = folder / LOCK
        self.stale_holder: str | None = None
        for _ in range(10):  # retried only when the file is swapped under us
            try:  # O_NOFOLLOW: a link planted at the lock's name is never written through
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as exc:
                raise RunFolderError(f"{self.path}: cannot be opened as the run's lock ({exc.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunLockedError(
                        f"{folder} is being written by {holder}; wait for it to finish or use another folder"
                    ) from None
                raise RunFolderError(f"{self.path}: cannot be locked ({exc.strerror})") from None
            # A releasing holder unlinks the file before unlocking it: if ours is no longer
            # the file at the path, we locked a dead inode and must start again.
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            mine = os.fstat(fd)
            if current is None or (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)
                continue
            previous = os.pread(fd, 4096, 0)
            if previous.strip():
                self.stale_holder = _holder_text(previous)
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200] if sys.argv else "python",
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
            self._finalizer = weakref.finalize(self, _release_lock, fd, self.path)
            return
        raise RunFolderError(f"{self.path}: kept changing while being locked")

    def release(self) -> None:
        self._finalizer()


def _release_lock(fd: int, path: Path) -> None:
    try:
        if os.path.exists(path) and os.path.samestat(os.stat(path), os.fstat(fd)):
            os.unlink(path)
    except OSError:
        pass
    os.close(fd)  # closing drops the flock


_HELD_LOCKS: "weakref.WeakValueDictionary[str, WriterLock]" = weakref.WeakValueDictionary()


def writer_lock(folder: Path) -> WriterLock:
    """This process's lock on `folder`, taken if not yet held."""
    key = str(folder.resolve())
    lock = _HELD_LOCKS.get(key)
    if lock is None:
        lock = WriterLock(folder)
        _HELD_LOCKS[key] = lock
    return lock


#: files a run folder's writer makes (a foreign one of these names would be overwritten)
