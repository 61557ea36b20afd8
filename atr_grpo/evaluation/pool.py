"""A small process pool whose every job has a wall-time deadline enforced from outside.

Why not `concurrent.futures.ProcessPoolExecutor`: it cannot kill one hung worker (killing one breaks
the whole pool), and `future.result(timeout=...)` leaves the hung call running. Here each worker has
its own pipe and one chunk of jobs at a time, answered with one message; it publishes which job it
is on, and since when, in a small shared array, so the parent can enforce a per-job deadline without a
message per job. A worker past its deadline is killed with SIGKILL and replaced: its job gets
`on_failure(job, "timeout")` and the rest of its chunk is queued again. Workers are forked where
possible, so they inherit the parent's imports (math-verify, sympy) and start in milliseconds.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Progress(Protocol):
    """What counts finished jobs: a tqdm bar, for one."""

    def update(self, n: int, /) -> object: ...


def _context() -> Any:
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def _worker_main(fn: Callable[[Any], Any], conn: Connection, current: Any) -> None:
    """Take chunks of (index, job) and answer each chunk with one message.

    `current` (shared memory, [start time, index]) tells the parent which job runs since when, so the
    deadline is per job without a message per job.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        replies = []
        for index, job in chunk:
            current[0] = time.monotonic()  # the time first: a stale index with a fresh time is harmless
            current[1] = index
            try:
                replies.append((index, True, fn(job)))
            except BaseException as err:  # report anything, including a stray timer interrupt
                replies.append((index, False, f"{type(err).__name__}: {err}"))
        current[1] = -1
        conn.send(replies)


class _Worker:
    def __init__(self, ctx: Any, fn: Callable[[Any], Any]) -> None:
        self.conn, child = ctx.Pipe()
        self.current = ctx.RawArray("d", [0.0, -1.0])  # [start time of the running job, its index]
        self.process = ctx.Process(target=_worker_main, args=(fn, child, self.current), daemon=True)
        self.process.start()
        child.close()
        self.in_flight: list[int] = []  # the chunk sent and not answered yet
        self.sent = 0.0

    def submit(self, indices: list[int], jobs: Sequence[Any]) -> None:
        self.in_flight, self.sent = indices, time.monotonic()
        self.conn.send([(i, jobs[i]) for i in indices])

    def running(self) -> tuple[int, float]:
        """(index, start time) of the job the worker is on; before it starts one, the chunk's first."""
        started, index = self.current[0], int(self.current[1])
        if index in self.in_flight and started >= self.sent:
            return index, started
        return self.in_flight[0], self.sent

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()


def chunk_size(num_jobs: int, workers: int) -> int:
    """Jobs per message: large enough to amortise the pipe, small enough (8 chunks per worker) to balance."""
    return max(1, min(32, num_jobs // (8 * workers)))


def run_with_deadline(
    fn: Callable[[Any], Any],
    jobs: Sequence[Any],
    workers: int,
    deadline_s: float,
    on_failure: Callable[[Any, str], Any],
    progress: Progress | None = None,
) -> list[Any]:
    """`[fn(job) for job in jobs]`, in `workers` processes, in order.

    Jobs travel in contiguous chunks (neighbouring jobs often share a gold answer, and each worker's
    parse cache then serves them), but the deadline is per job: a worker whose current job runs longer
    than `deadline_s` is killed (`on_failure(job, "timeout")`) and replaced, and the rest of its chunk
    is queued again. A worker that dies gives `on_failure(job, "crash")`. An exception raised by `fn`
    is re-raised here as a RuntimeError (a bug or a data error, not a verdict).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    run = _Run(fn, jobs, workers, on_failure, progress)
    try:
        for worker in run.pool:
            run.feed(worker)
        while any(w.in_flight for w in run.pool):
            busy = [w for w in run.pool if w.in_flight]
            next_deadline = min(w.running()[1] + deadline_s for w in busy)
            ready = wait([w.conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            for worker in busy:
                if worker.conn in ready:
                    run.receive(worker)
                elif time.monotonic() - worker.running()[1] > deadline_s:
                    log.warning("a job passed its %.1f s deadline; killing its worker", deadline_s)
                    run.feed(run.replace(worker, "timeout"))
    finally:
        run.close()
    return run.results


class _Run:
    """One `run_with_deadline` call's workers, its queue of job indices and its results."""

    def __init__(
        self,
        fn: Callable[[Any], Any],
        jobs: Sequence[Any],
        workers: int,
        on_failure: Callable[[Any, str], Any],
        progress: Progress | None,
    ) -> None:
        self.fn, self.jobs, self.on_failure, self.progress = fn, jobs, on_failure, progress
        self.ctx = _context()
        self.results: list[Any] = [None] * len(jobs)
        self.size = chunk_size(len(jobs), workers)
        self.pending = deque(range(len(jobs)))
        self.pool = [_Worker(self.ctx, fn) for _ in range(min(workers, len(jobs)))]

    def feed(self, worker: _Worker) -> None:
        if self.pending and not worker.in_flight:
            worker.submit([self.pending.popleft() for _ in range(min(self.size, len(self.pending)))], self.jobs)

    def finish(self, index: int, value: Any) -> None:
        self.results[index] = value
        if self.progress is not None:
            self.progress.update(1)

    def receive(self, worker: _Worker) -> None:
        """The answer of a worker whose pipe is ready: its chunk's results, or its death (a crash)."""
        try:
            replies = worker.conn.recv()
        except (EOFError, OSError):  # the worker died (segfault, out of memory)
            self.feed(self.replace(worker, "crash"))
            return
        for index, ok, value in replies:
            if not ok:
                raise RuntimeError(f"job {index} failed in a worker: {value}")
            self.finish(index, value)
        worker.in_flight = []
        self.feed(worker)

    def replace(self, worker: _Worker, reason: str) -> _Worker:
        """Kill `worker`: its current job fails with `reason`, the rest of its chunk is queued again."""
        failed, _ = worker.running()
        worker.kill()
        self.pending.extendleft(reversed([i for i in worker.in_flight if i != failed]))
        self.finish(failed, self.on_failure(self.jobs[failed], reason))
        fresh = _Worker(self.ctx, self.fn)
        self.pool[self.pool.index(worker)] = fresh
        return fresh

    def close(self) -> None:
        for worker in self.pool:
            if worker.in_flight:
                worker.kill()
            else:
                worker.stop()
