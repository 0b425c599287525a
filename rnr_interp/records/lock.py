"""The writer lock: one process writes a run folder at a time (an `flock` on
`run/.lock` that names its holder, see `rnr_interp.lockfile`)."""

from __future__ import annotations

import errno
import fcntl
import os
import weakref
from pathlib import Path

from rnr_interp.lockfile import claim, read_holder
from rnr_interp.records.schema import LOCK, RunFolderError, RunLockedError

# -- the writer lock ----------------------------------------------------------------


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
                holder = read_holder(fd)
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
            self.stale_holder = claim(fd)
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
