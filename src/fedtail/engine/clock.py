"""A run's wall clock, less the time its process was stopped.

A run on a shared machine may be suspended: ``kill -STOP`` while another job has the cores, a
laptop asleep, a paused container. ``time.perf_counter`` (CLOCK_MONOTONIC) counts those seconds, so
a run's ``wall_time_s``, each metrics row's ``elapsed_s`` and the time to an accuracy level
(MuPFL's Fig. 8(a), ``fedtail report --clients-to``) would count them as if the run had worked.

A daemon thread (one per process, started by the first :class:`RunClock`) wakes every
:data:`TICK` seconds. A wake that comes more than :data:`LATE` seconds late while the process's CPU
time advanced by less than :data:`BUSY` of the wait means every thread of the process stood still:
it was stopped, not merely slow (a loaded machine delays a wake by milliseconds; a long call that
holds the GIL keeps the CPU busy). The lateness is added to :func:`suspended`, which
:class:`RunClock` subtracts; ``summary.json`` says how much it subtracted (``suspended_s``).
A stop shorter than :data:`LATE` seconds is not seen, and counts as work.
"""

from __future__ import annotations

import threading
import time

TICK = 1.0  # seconds between the watcher's wakes
LATE = 5.0  # a wake this many seconds late (or more) is a stop, when the CPU was idle
BUSY = 0.2  # ... idle: CPU time advanced by less than this fraction of the wait

_lock = threading.Lock()
_suspended = 0.0
_watcher: threading.Thread | None = None


def lateness(waited: float, cpu: float, tick: float = TICK) -> float:
    """Seconds of a wait of ``waited`` (for a sleep of ``tick``) that the process stood stopped, given
    the ``cpu`` seconds the process used meanwhile: 0 unless the wake is :data:`LATE` and the CPU idle."""
    late = waited - tick
    return late if late >= LATE and cpu < BUSY * waited else 0.0


def _watch() -> None:
    global _suspended
    mono, cpu = time.monotonic(), time.process_time()
    while True:
        time.sleep(TICK)
        now, now_cpu = time.monotonic(), time.process_time()
        stopped = lateness(now - mono, now_cpu - cpu)
        if stopped:
            with _lock:
                _suspended += stopped
        mono, cpu = now, now_cpu


def suspended() -> float:
    """Seconds this process has been seen stopped since its first :class:`RunClock`."""
    with _lock:
        return _suspended


class RunClock:
    """Seconds since :meth:`start` (plus ``before``, a restored checkpoint's), stops excluded."""

    def __init__(self) -> None:
        global _watcher
        with _lock:
            if _watcher is None:
                _watcher = threading.Thread(target=_watch, name="fedtail-clock", daemon=True)
                _watcher.start()
        self.start(0.0)

    def start(self, before: float, suspended_before: float = 0.0) -> None:
        """Count from now, ``before`` seconds already run, of which ``suspended_before`` were stops."""
        self._t0, self._s0 = time.perf_counter() - before, suspended()
        self._before_suspended = suspended_before

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0 - (suspended() - self._s0)

    def suspended(self) -> float:
        """Seconds of stops left out, those before a restored checkpoint included."""
        return self._before_suspended + suspended() - self._s0
