"""bench/tensor_parallel/run.py's stall evidence, taken from the session's real vLLM server.

On the lab GPU a stalled TP=2 start is dumped with py-spy before it is stopped (2026-11-29: two
starts stalled and their log was lost). Here the same code reads a real vLLM 0.32.0 process group
(API server, engine core, worker): the processes are found, the workers come first, and py-spy
reads every one of them, as it must on the lab host.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from bench.serving.server import VllmServer
from bench.tensor_parallel import prepare, run
from tests.support.vllm_server import RunningVllmServer

pytestmark = pytest.mark.e2e


def test_the_process_group_lists_the_engine_and_its_worker_first(vllm_server: RunningVllmServer) -> None:
    processes = run.group_processes(vllm_server.process.pid)
    commands = [process["command"] for process in processes]
    assert vllm_server.process.pid in {process["pid"] for process in processes}
    assert any("EngineCore" in command for command in commands), commands
    workers = [index for index, command in enumerate(commands) if "Worker" in command]
    engine = next(index for index, command in enumerate(commands) if "EngineCore" in command)
    assert all(index < engine for index in workers), commands


def test_stall_evidence_dumps_every_vllm_process_with_py_spy(
    vllm_server: RunningVllmServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test venv's own (pip puts its binary beside the interpreter), else one on PATH.
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    assert py_spy, "py-spy is a test dependency (pyproject.toml [test])"
    monkeypatch.setenv("TP_PY_SPY", py_spy)
    plan = json.loads(prepare.PLAN_FILE.read_text())
    runner = run.Runner(
        plan,
        tmp_path,
        300.0,
        run.Mode("cpu", sys.executable),
        gpu=0,
        keep_compile_cache=False,
        vllm_debug=False,
    )
    # The session's server in the runner's server type (the same process and log, nothing restarted).
    server = VllmServer("tp2", [], {}, vllm_server.log_path, port=vllm_server.port)
    server.process = vllm_server.process
    stall = run.StallError("tp2", "torch_compile_s", at_s=116.2, waited_s=151.0, limit_s=150.0)

    summary = runner.stall_evidence(server, stall)

    assert summary["py_spy"] == "found" and summary["dump_file"] == "tp-tp2-stall.txt"
    assert summary["py_spy_dumps"], summary
    assert set(summary["py_spy_dumps"].values()) == {"ok"}, summary["py_spy_dumps"]
    text = (tmp_path / "tp-tp2-stall.txt").read_text()
    assert "stalled: no KV-cache size 151 s after torch_compile_s" in text
    # Python stacks of the real processes: the engine core's busy loop, the API server's event loop.
    assert "EngineCoreProc" in text and "run_busy_loop" in text
    assert "$ df -h /dev/shm" in text and "log tail:" in text
