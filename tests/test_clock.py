"""A run's clock leaves out the seconds its process stood stopped (engine/clock.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import tiny_config
from fedtail.engine import clock
from fedtail.engine.clock import LATE, RunClock, lateness
from helpers import simulation


def test_a_late_wake_counts_only_when_the_process_used_no_cpu():
    assert lateness(1.0, 0.0) == 0.0  # on time
    assert lateness(1.0 + LATE - 0.5, 0.0) == 0.0  # late, but less than LATE: a slow machine
    assert lateness(21.0, 0.01) == pytest.approx(20.0)  # stopped for 20 s
    assert lateness(21.0, 18.0) == 0.0  # the process worked meanwhile: a long call held the GIL


def test_the_clock_subtracts_the_stops_it_was_told_of(monkeypatch):
    seen = [0.0]
    monkeypatch.setattr(clock, "suspended", lambda: seen[0])
    c = RunClock()
    c.start(before=100.0, suspended_before=4.0)  # a resumed run: 100 s before, 4 s of them stops
    seen[0] = 3600.0  # an hour's stop (negative elapsed would show it was not subtracted)
    assert c.elapsed() < 0 and c.elapsed() == pytest.approx(100.0 - 3600.0, abs=1.0)
    assert c.suspended() == pytest.approx(3604.0)


CHILD = """
import json, time
from fedtail.engine.clock import RunClock
c = RunClock()
t0 = time.monotonic()
print("ready", flush=True)
while time.monotonic() - t0 < {total}:
    time.sleep(0.05)
print(json.dumps({{"elapsed": c.elapsed(), "suspended": c.suspended(), "wall": time.monotonic() - t0}}), flush=True)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX job-control signals")
def test_a_process_stopped_with_sigstop_leaves_the_stop_out_of_its_elapsed_time():
    stop = LATE + 2.5
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(total=stop + 4.0)], stdout=subprocess.PIPE, text=True,
                             env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        child.send_signal(signal.SIGSTOP)
        time.sleep(stop)
        child.send_signal(signal.SIGCONT)
        out = json.loads(child.stdout.readline())
    finally:
        child.kill()
        child.wait()
    assert stop - 1.5 <= out["suspended"] <= stop + 1.5, out
    assert out["elapsed"] == pytest.approx(out["wall"] - out["suspended"], abs=0.5)
    assert out["elapsed"] < out["wall"] - (stop - 1.5)


def test_a_run_reports_its_stops_and_a_checkpoint_carries_them(monkeypatch):
    sim = simulation(tiny_config(rounds=2))
    summary = sim.run()
    assert summary["suspended_s"] == pytest.approx(0.0, abs=1.5) and summary["wall_time_s"] > 0
    state = sim.checkpoint_state(sim.elapsed())
    assert "suspended_s" in state
    resumed = simulation(tiny_config(rounds=3))
    resumed.restore(state | {"config": resumed.config.model_dump(mode="json"), "suspended_s": 12.5})
    assert resumed.run()["suspended_s"] >= 12.5
