"""plots/gpu-h200/watchdog.py's liveness check (the GPU lease's stop rule waits on it; the dry run found the race)."""
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "plots" / "gpu-h200" / "watchdog.py"


@pytest.fixture
def watchdog():
    spec = importlib.util.spec_from_file_location("watchdog", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_alive_for_a_running_process_dead_for_a_zombie_and_a_reaped_one(watchdog, monkeypatch):
    assert watchdog.alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child.pid}/stat").read_text().split()[2] != "Z":     # exited, not yet reaped
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    assert not watchdog.alive(child.pid)
    child.wait()
    assert not watchdog.alive(child.pid)
    # Reaped between os.kill's look and /proc's (the dry run of 2026-11-29 printed a traceback here): not alive
    monkeypatch.setattr(watchdog.os, "kill", lambda pid, signal: None)
    assert not watchdog.alive(child.pid)
