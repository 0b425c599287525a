"""Run searches in lockstep, so that the routes many searches and questions wait on
are generated in shared batches.

Each job (a search on one question; the audit runs every search of a chunk of
questions as jobs of one lockstep) runs in its own thread and blocks inside `evaluate`;
when every live job is waiting, the main thread hands all pending (question, route)
requests to `run_batch` in one call (the audit's `RouteEvaluator` batches them, whatever
their routes) and wakes the jobs. Only the main thread touches the model. The first
request of every search is the full path, so the first round holds it once per
question; random search with a shared seed asks every question for the same routes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

from .spaces import LayerPath


@dataclass
class _Request:
    key: Hashable  # the question
    routes: list[LayerPath]
    result: list[Any] | None = None


@dataclass
class Lockstep:
    """`run_batch(requests: list[(key, route)]) -> list[value]` is called by the main
    thread only, with requests grouped as it likes."""

    run_batch: Callable[[list[tuple[Hashable, LayerPath]]], list[Any]]
    _cv: threading.Condition = field(default_factory=threading.Condition)
    _pending: list[_Request] = field(default_factory=list)
    _live: int = 0

    def evaluate_for(self, key: Hashable) -> Callable[[list[LayerPath]], list[Any]]:
        def evaluate(routes: list[LayerPath]) -> list[Any]:
            req = _Request(key, [tuple(r) for r in routes])
            with self._cv:
                self._pending.append(req)
                self._cv.notify_all()
                self._cv.wait_for(lambda: req.result is not None)
            return req.result

        return evaluate

    def run(self, jobs: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run every job (a search closure using `evaluate_for`) to completion."""
        results: list[Any] = [None] * len(jobs)
        errors: list[BaseException] = []

        def worker(i: int, job: Callable[[], Any]):
            try:
                results[i] = job()
            except BaseException as exc:  # surfaced in the main thread below
                errors.append(exc)
            finally:
                with self._cv:
                    self._live -= 1
                    self._cv.notify_all()

        threads = [threading.Thread(target=worker, args=(i, job), daemon=True) for i, job in enumerate(jobs)]
        with self._cv:
            self._live = len(threads)
        for t in threads:
            t.start()
        while True:
            with self._cv:
                # Wait until every live search is blocked on a request (or all are done).
                self._cv.wait_for(lambda: self._live == 0 or len(self._pending) >= self._live)
                if self._live == 0 and not self._pending:
                    break
                batch, self._pending = self._pending, []
            flat = [(req.key, r) for req in batch for r in req.routes]
            values = self.run_batch(flat) if flat else []
            at = 0
            with self._cv:
                for req in batch:
                    req.result = values[at:at + len(req.routes)]
                    at += len(req.routes)
                self._cv.notify_all()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results
