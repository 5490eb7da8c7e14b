"""Prefetch buffers (the Rust crate's prefetch.rs, simplified): IDs of one
(mode, tag) served from a local deque, refilled in the background by
daemon threads when fewer than `low` remain. The fast path is one
deque.popleft (atomic under the GIL: each ID is handed out once); a
None placed at each batch's low-water mark starts the next refill, and a
thread throws away snowflake IDs that aged. Refills in flight
start at one and grow by one (up to `max_refills`) each time a caller
found the buffer empty, and the buffer keeps `low` plus a batch per lane
ahead, counting refills in flight; a buffer keeps at most one refill per
node, so one node's batches are appended in the order it issued them.
Refills run on worker threads kept for the buffer's life."""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Deque, List, Optional, Set, Tuple

from ._errors import ConfigError, DeadlineExceededError, IdgenError

if TYPE_CHECKING:
    from ._client import Client


@dataclass(frozen=True)
class PrefetchConfig:
    """`size`: IDs one refill asks for (at most the nodes'
    server.max_batch, 10,000 by default); `low`: refill when fewer remain;
    `max_snowflake_age`: snowflake IDs received longer ago than this (s)
    are thrown away unused, so their time stays close to the time of use
    (gaps, never repeats); `max_refills`: most refills in flight at once."""

    size: int = 1000
    low: int = 500
    max_snowflake_age: float = 5.0
    max_refills: int = 3

    def validate(self) -> None:
        if self.size < 1:
            raise ConfigError("prefetch size must be at least 1, got %d" % self.size)
        if not 0 <= self.low < self.size:
            raise ConfigError("prefetch low must be in [0, size=%d), got %d"
                              % (self.size, self.low))
        if self.max_snowflake_age <= 0:
            raise ConfigError("prefetch max_snowflake_age must be above zero")
        if not 1 <= self.max_refills <= 64:
            raise ConfigError("prefetch max_refills must be between 1 and 64, got %d"
                              % self.max_refills)


class Prefetcher:
    """The buffer of one (mode, tag); `next_id()` is the whole API."""

    def __init__(self, client: "Client", mode: str, tag: str, config: PrefetchConfig,
                 fetch: Callable[[int, Set[str]], List]) -> None:
        self._client = client
        self._mode, self._tag, self._config = mode, tag, config
        self._fetch = fetch
        # IDs, and a None at the low-water mark of each batch: taking it
        # starts a refill (so the fast path checks no length).
        self._ids: Deque = collections.deque()
        # (received at, count with its mark) per batch in the deque, oldest first.
        self._batches: Deque[Tuple[float, int]] = collections.deque()
        # One lock: callers wait on _cond for IDs, refill workers on _work
        # for a refill to make.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._work = threading.Condition(lock)
        self._inflight = 0
        # Refills asked for that no worker has taken yet, and the worker
        # threads started (kept: starting a thread per refill made the
        # caller that hit the low-water mark wait for the thread to start).
        self._wanted = 0
        self._workers = 0
        self._lanes = 1
        self._busy: Set[str] = set()
        self._finished = 0
        self._last_error: Optional[IdgenError] = None
        self._closed = False
        self.next_id = self._make_next()
        if mode == "snowflake":
            threading.Thread(target=self._janitor, name="idgen-prefetch-age",
                             daemon=True).start()

    def _make_next(self) -> Callable[[], int]:
        pop = self._ids.popleft
        slow = self._next_slow
        kick = self._kick

        def next_id() -> int:
            """The next ID: from memory unless the buffer is empty."""
            try:
                value = pop()
            except IndexError:
                return slow()
            if value is None:
                kick()
                return next_id()
            return value

        return next_id

    def _pop_now(self) -> int:
        """An ID from the buffer without waiting; IndexError when it is
        empty (the asyncio fast path)."""
        value = self._ids.popleft()
        while value is None:
            self._kick()
            value = self._ids.popleft()
        return value

    def depth(self) -> int:
        """IDs in the buffer now (low-water marks included)."""
        return len(self._ids)

    def _kick(self) -> None:
        with self._cond:
            self._start_refills()

    def _start_refills(self) -> None:
        # Called with the lock held.
        if self._closed:
            return
        size = self._config.size
        while self._inflight < self._lanes and \
                len(self._ids) + self._inflight * size < self._config.low + self._lanes * size:
            self._inflight += 1
            self._wanted += 1
            if self._workers < self._inflight:
                self._workers += 1
                threading.Thread(target=self._worker, name="idgen-refill", daemon=True).start()
            self._work.notify()

    def _worker(self) -> None:
        """A refill thread: makes the refills asked for until the buffer closes."""
        while True:
            with self._work:
                while not self._wanted and not self._closed:
                    self._work.wait()
                if self._closed:
                    return
                self._wanted -= 1
            self._refill()

    def _refill(self) -> None:
        size = self._config.size
        try:
            ids = self._fetch(size, self._busy)
            error = None
        except IdgenError as e:
            ids, error = [], e
        self._client._metrics.refill(self._mode, "error" if error else "ok")
        with self._cond:
            self._inflight -= 1
            self._finished += 1
            self._last_error = error
            if ids and not self._closed:
                # The mark: where `low` IDs are left, counting this batch.
                ids.insert(max(0, len(ids) - self._config.low), None)
                self._batches.append((time.monotonic(), len(ids)))
                self._ids.extend(ids)
                self._start_refills()
            self._cond.notify_all()

    def _janitor(self) -> None:
        """Snowflake only: throws away IDs received longer than
        max_snowflake_age ago (gaps, never repeats)."""
        period = self._config.max_snowflake_age / 4
        with self._cond:
            while not self._closed:
                self._cond.wait(period)
                self._drop_stale()

    def _drop_stale(self) -> None:
        """Forgets used-up batches and throws away the rest of batches
        older than max_snowflake_age. Lock held. A caller taking IDs at the
        same time can make this throw away one more ID than needed: a
        gap, never a repeat (each popleft hands out a distinct ID)."""
        batches = self._batches
        newer = sum(c for _, c in batches)
        now = time.monotonic()
        while batches:
            received, count = batches[0]
            newer -= count
            left = min(count, len(self._ids) - newer)
            if left <= 0:
                batches.popleft()
                continue
            if self._mode != "snowflake" or now - received < self._config.max_snowflake_age:
                break
            dropped = 0
            for _ in range(left):
                try:
                    if self._ids.popleft() is not None:
                        dropped += 1
                except IndexError:
                    break
            batches.popleft()
            self._client._metrics.discarded("age", dropped)
            self._lanes = max(1, self._lanes - 1)
        if len(self._ids) < self._config.low:
            self._start_refills()

    def _next_slow(self) -> int:
        deadline = self._client.deadline
        end = time.monotonic() + deadline
        with self._cond:
            stalled = False
            while True:
                try:
                    return self._pop_now()
                except IndexError:
                    pass
                if self._closed:
                    raise ConfigError("the client is closed")
                if not stalled:
                    stalled = True
                    self._client._metrics.stall()
                    self._lanes = min(self._config.max_refills, self._lanes + 1)
                seen = self._finished
                self._start_refills()
                left = end - time.monotonic()
                if left <= 0:
                    raise DeadlineExceededError(deadline, "waiting for a prefetch refill", 0, 0)
                self._cond.wait(left)
                if not self._ids and self._finished != seen and self._last_error is not None:
                    raise self._last_error

    def close(self) -> None:
        """Stops refilling; IDs still buffered are dropped (gaps)."""
        with self._cond:
            self._closed = True
            dropped = sum(1 for v in self._ids if v is not None)
            self._ids.clear()
            self._batches.clear()
            self._cond.notify_all()
            self._work.notify_all()
        if dropped:
            self._client._metrics.discarded("shutdown", dropped)
