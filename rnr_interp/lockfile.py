"""Who holds a lock file. The process that takes a lock file's flock writes a JSON record of
itself into that file (pid, host, start time, command), so a process that finds the lock
taken can say whom it waits for. The run folder's writer lock and the model cache's maker
lock both keep their holder this way; the kernel drops a dead holder's flock, and the next
holder overwrites what the dead one wrote."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

NO_DETAILS = "a process that left no details"


def holder_text(raw: bytes) -> str:
    """A holder record as one line, or `NO_DETAILS` for anything else (empty, torn, foreign)."""
    try:
        h = json.loads(raw.decode())
        return f"pid {h['pid']} on {h['host']} since {h['started']} ({h['command']})"
    except (ValueError, KeyError, TypeError):
        return NO_DETAILS


def read_holder(fd: int) -> str:
    """Who holds the lock on `fd`. A holder writes its record just after taking the flock,
    so a racing reader can find the file still empty: it looks again for up to a second
    before saying the holder left none."""
    for _ in range(20):
        text = holder_text(os.pread(fd, 4096, 0))
        if text != NO_DETAILS:
            return text
        time.sleep(0.05)
    return holder_text(os.pread(fd, 4096, 0))


def claim(fd: int) -> str | None:
    """Write this process's record into the lock file on `fd`, whose flock it now holds.
    Returns what an earlier holder left there (one killed before it cleared it), if anything."""
    previous = os.pread(fd, 4096, 0)
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200] if sys.argv else "python",
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    return holder_text(previous) if previous.strip() else None


def clear(fd: int) -> None:
    """Empty the lock file on `fd` before its flock is dropped, so a later waiter names no
    finished holder."""
    os.ftruncate(fd, 0)
