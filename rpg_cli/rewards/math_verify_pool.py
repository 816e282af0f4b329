"""Parent side of the math-verify scorer: a small pool of worker processes with a per-item deadline.

Why processes: math-verify times out with SIGALRM, which only works in a main thread, and sympy can
spin inside C code where no signal handler runs. Each worker enforces a soft timeout itself
(see math_verify_worker); the parent enforces a hard deadline on top and kills and replaces a worker
that overruns it. Either way the item is scored incorrect with pred None and counted in `timeouts`.
The pool is thread-safe: callers in any thread borrow an idle worker, so verl's threaded reward
managers can call it concurrently.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_TIMEOUT_S = 5.0
HARD_GRACE_S = 2.0  # beyond the soft timeout, how long the parent waits before killing a worker
STARTUP_TIMEOUT_S = 120.0  # importing sympy on a busy machine can be slow
_WORKER_MODULE = "rpg_cli.rewards.math_verify_worker"


class _Worker:
    """One `python -m rpg_cli.rewards.math_verify_worker` child talking over a socket pair.

    A plain subprocess rather than multiprocessing: spawn/forkserver children re-import the parent's
    __main__ (verl's trainer, a Ray worker), which is slow and not always safe to import twice.
    """

    def __init__(self):
        self.conn, child_conn = multiprocessing.Pipe()  # a Unix socket pair with pickle framing
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen(
            [sys.executable, "-m", _WORKER_MODULE, str(child_conn.fileno())],
            pass_fds=[child_conn.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        child_conn.close()
        self.ready = False

    def wait_ready(self) -> None:
        if self.ready:
            return
        try:
            started = self.conn.poll(STARTUP_TIMEOUT_S) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            started = False
        if not started:
            raise RuntimeError(
                "a math-verify worker process failed to start; run `python -m rpg_cli.rewards.math_verify_worker` to see why"
            )
        self.ready = True

    def stop(self) -> None:
        self.conn.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def _result(correct: bool, pred: str | None) -> dict:
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


class MathVerifyPool:
    """`workers` math-verify processes; `score_one`/`score_many` return scorer dicts, never raise on content."""

    def __init__(self, workers: int = 2, timeout: float = DEFAULT_TIMEOUT_S):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if importlib.util.find_spec("math_verify") is None:
            raise RuntimeError("the math_verify scorer needs the math-verify package: pip install 'math-verify>=0.9'")
        self.workers = workers
        self.timeout = timeout
        self.timeouts = 0  # items scored incorrect because they ran out of time
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(workers):
            self._spawn()

    def _spawn(self) -> None:
        worker = _Worker()
        with self._lock:
            self._all.add(worker)
        self._idle.put(worker)

    def _retire(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.stop()
        if not self._closed:
            self._spawn()

    def score_one(self, solution: str, ground_truth: str, timeout: float | None = None) -> dict:
        if self._closed:
            raise RuntimeError("MathVerifyPool is closed")
        timeout = self.timeout if timeout is None else timeout
        worker = self._idle.get()
        try:
            worker.wait_ready()
            worker.conn.send((str(solution), str(ground_truth), timeout))
            if worker.conn.poll(timeout + HARD_GRACE_S):
                correct, pred, timed_out = worker.conn.recv()
            else:  # stuck where the worker's alarm cannot reach: kill it
                self._retire(worker)
                worker = None
                correct, pred, timed_out = False, None, True
        except (EOFError, OSError):  # the worker died (e.g. out of memory): replace it, score incorrect
            self._retire(worker)
            worker = None
            correct, pred, timed_out = False, None, False
        except BaseException:
            self._retire(worker)  # state unknown (Ctrl-C mid-item): do not hand this worker out again
            worker = None
            raise
        finally:
            if worker is not None:
                self._idle.put(worker)
        if timed_out:
            with self._lock:
                self.timeouts += 1
        return _result(correct, pred)

    def score_many(
        self, solutions: Sequence[str], ground_truths: Sequence[str], timeout: float | None = None
    ) -> list[dict]:
        """Score pairs in order, all workers busy at once."""
        if len(solutions) != len(ground_truths):
            raise ValueError(f"{len(solutions)} solutions but {len(ground_truths)} ground truths")
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="rpg-math-verify") as threads:
            return list(
                threads.map(lambda pair: self.score_one(pair[0], pair[1], timeout), zip(solutions, ground_truths))
            )

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.stop()

    def __enter__(self) -> MathVerifyPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
