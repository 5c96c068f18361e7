"""The GPU phases' logic end to end, with a stand-in server process instead of vLLM.

Each phase starts real processes in their own sessions, waits for /health or the KV-cache log lines,
drives the load levels, restarts, stops every process group and leaves its JSON and logs behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from bench.serving import phases, prepare, server
from tests.conftest import REPO_ROOT

WORKLOAD = {
    "input_len": 16,
    "output_len": 20,
    "concurrency": [1, 4],
    "num_prompts": {"1": 2, "4": 8},
    "level_time_cap_s": 10,
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class StandInLab(phases.Lab):
    """Starts bench.serving.fake_server with the plan's arguments (it ignores vLLM's flags)."""

    fail_with_exit_code: int | None = None

    def server_command(self, args: list[str]) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "bench.serving.fake_server",
            "--fake-port",
            str(self.plan["lab"]["port"]),
            "--startup-s",
            "0.3",
        ]
        if self.fail_with_exit_code is not None:
            command += ["--exit-code", str(self.fail_with_exit_code)]
        return command + args

    def server_env(self, start_name: str) -> dict[str, str]:
        env = super().server_env(start_name)
        env["PYTHONPATH"] = str(REPO_ROOT)
        return env


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StandInLab:
    work = tmp_path / "work"
    monkeypatch.setattr(server, "REGISTRY", work / "process-groups")
    monkeypatch.setattr(phases, "WORK_DIR", work)
    monkeypatch.setattr(phases, "SHARED_CACHE_DIR", work / "vllm-cache")
    monkeypatch.setattr(
        phases, "check_arguments_with_real_parser", lambda _lab, lists: {name: "accepted" for name in lists}
    )
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_text(
        json.dumps({"added_tokens": [{}, {}, {}], "model": {"vocab": {str(i): i for i in range(500)}}})
    )
    plan = json.loads(prepare.PLAN_FILE.read_text())
    plan["lab"]["port"] = _free_port()
    return StandInLab(
        plan,
        False,
        sys.executable,
        str(model_dir),
        WORKLOAD,
        plan["baseline"],
        health_timeout_cold_s=60,
        health_timeout_warm_s=60,
    )


def _phase(name: str, tmp_path: Path, lab: phases.Lab, budget_s: float = 600) -> phases.Phase:
    return phases.Phase(name, tmp_path / "out", budget_s, lab)


def _no_registered_groups() -> bool:
    return not server.REGISTRY.exists() or not server.REGISTRY.read_text().strip()


def test_stack_phase_measures_cold_start_levels_and_warm_restart(tmp_path: Path, lab: StandInLab) -> None:
    phase = _phase("stack", tmp_path, lab)
    phases.phase_stack(phase, lab)
    phase.finish("completed")

    result = json.loads((tmp_path / "out" / "stack.json").read_text())
    assert result["status"] == "completed"
    assert result["serve_args"] == lab.plan["lab"]["serve_args"]
    assert 0 < result["cold_start_s"] < 60 and 0 < result["warm_start_s"] < 60
    assert result["kv_cache"]["kv_cache_tokens"] == 1_658_880
    assert result["kv_cache"]["max_concurrency_context_tokens"] == 16_384
    for concurrency in ("1", "4"):
        level = result["levels"][concurrency]
        assert level["completed"] == WORKLOAD["num_prompts"][concurrency] and level["failed"] == 0
        assert level["output_tokens"] == level["completed"] * WORKLOAD["output_len"]
    requests = json.loads((tmp_path / "out" / "stack-requests.json").read_text())
    assert len(requests["4"]) == 8
    logs = (tmp_path / "out" / "stack-logs.txt").read_text()
    assert logs.count("===== stack-") == 2 and "GPU KV cache size" in logs
    assert all(not started.running for started in phase.servers)
    assert _no_registered_groups()
    # The warm start found the shared cache folder; HOME was the pod's path, emptied for each start.
    assert (phases.WORK_DIR / "warm-start-done").exists()
    assert (phases.pod_scratch() / "home").is_dir()
    assert sorted(path.name for path in (phases.WORK_DIR / "scratch").iterdir()) == ["pod"]


def test_every_start_gets_the_same_home_path_emptied_as_a_new_pod_has(lab: StandInLab) -> None:
    # vLLM 0.26.0 hashes $HOME/.config/vllm into its compile-cache key: a new path would recompile.
    first = lab.server_env("stack-cold")
    left_behind = Path(first["HOME"]) / ".cache" / "flashinfer" / "kernel.so"
    left_behind.parent.mkdir(parents=True)
    left_behind.write_text("x")
    second = lab.server_env("stack-warm")
    assert second["HOME"] == first["HOME"] and second["TMPDIR"] == first["TMPDIR"]
    assert Path(second["HOME"]).is_dir() and not left_behind.exists()
    assert second["VLLM_CACHE_ROOT"] == str(phases.SHARED_CACHE_DIR)
    assert second["FLASHINFER_WORKSPACE_BASE"].startswith(str(phases.SHARED_CACHE_DIR) + "/")


def test_defaults_phase_runs_levels_then_kv_probes(tmp_path: Path, lab: StandInLab) -> None:
    (phases.WORK_DIR).mkdir(parents=True, exist_ok=True)
    (phases.WORK_DIR / "warm-start-done").write_text("30")
    phase = _phase("defaults", tmp_path, lab)
    phases.phase_defaults(phase, lab)
    phase.finish("completed")
    result = json.loads((tmp_path / "out" / "defaults.json").read_text())
    assert result["serve_args"] == lab.plan["defaults"]["serve_args"]
    assert set(result["levels"]) == {"1", "4"}
    assert set(result["kv_probes"]) == {probe["name"] for probe in lab.plan["probes"]}
    assert all(probe["kv_cache_tokens"] == 1_658_880 for probe in result["kv_probes"].values())
    assert "warm_start_s" not in result, "the stack phase had already done the warm restart"
    assert _no_registered_groups()


def test_levels_that_do_not_fit_the_budget_are_skipped_not_cut(tmp_path: Path, lab: StandInLab) -> None:
    phase = _phase("stack", tmp_path, lab, budget_s=25)  # room for the start, not for a 10 s level + 20 s
    phases.phase_stack(phase, lab)
    phase.finish("completed")
    result = json.loads((tmp_path / "out" / "stack.json").read_text())
    assert result["skipped_levels"] == [1, 4]
    assert "levels" not in result or not result["levels"]
    assert _no_registered_groups()


def test_server_that_dies_fails_the_phase_with_its_log_and_leaves_nothing_running(
    tmp_path: Path, lab: StandInLab
) -> None:
    lab.fail_with_exit_code = 3
    phase = _phase("stack", tmp_path, lab)
    with pytest.raises(server.ServerFailedError, match="exited with code 3") as caught:
        phases.phase_stack(phase, lab)
    assert "fake failure" in str(caught.value)
    phase.result["error"] = str(caught.value)
    phase.finish("failed")
    result = json.loads((tmp_path / "out" / "stack.json").read_text())
    assert result["status"] == "failed"
    assert result["starts"]["stack-cold"]["error"].startswith("exited with code 3")
    assert _no_registered_groups()


def test_stopping_a_server_kills_its_whole_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "REGISTRY", tmp_path / "process-groups")
    child_pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(child_pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('Available KV cache memory: 1.00 GiB', flush=True)\n"
        "print('GPU KV cache size: 1,000 tokens', flush=True)\n"
        "print('Maximum concurrency for 100 tokens per request: 10.00x', flush=True)\n"
        "time.sleep(600)\n"
    )
    started = server.VllmServer(
        "sleeper", [sys.executable, "-c", script], dict(os.environ), tmp_path / "log", port=_free_port()
    )
    started.start()
    record = started.wait(until="kv", timeout_s=30)
    assert record.facts["kv_cache_tokens"] == 1000
    child_pid = int(child_pid_file.read_text())
    started.stop(grace_s=5)
    assert not started.running
    stat = Path(f"/proc/{child_pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"), (
        "grandchild runs on"
    )
    assert not server.group_alive(started.process.pid)
    assert not server.REGISTRY.read_text().strip()


def test_registered_leftovers_are_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "REGISTRY", tmp_path / "process-groups")
    import subprocess

    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    server._register(leftover.pid)
    assert server.kill_registered(grace_s=5) == [leftover.pid]
    assert leftover.wait(timeout=10) == -signal.SIGTERM


def test_server_refuses_to_start_on_a_port_someone_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.serving.fake_server import fake_vllm_server

    monkeypatch.setattr(server, "REGISTRY", tmp_path / "process-groups")
    with fake_vllm_server() as port:
        busy = server.VllmServer(
            "late", [sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "log", port=port
        )
        with pytest.raises(server.ServerFailedError, match="already in use"):
            busy.start()
    assert busy.process is None


def test_capacity_runs_go_to_the_capacity_script_and_their_observations_come_back(
    tmp_path: Path, lab: StandInLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "measure_kv_cache.py"
    script.write_text(
        "import json, sys\n"
        "args = sys.argv[1:]\n"
        "out = args[args.index('--out') + 1]\n"
        "names = [args[i + 1] for i, a in enumerate(args) if a == '--only']\n"
        "observations = [{'name': n, 'outcome': 'ok'} for n in names]\n"
        "json.dump({'plan': args[0], 'observations': observations}, open(out, 'w'))\n"
    )
    monkeypatch.setattr(phases, "CAPACITY_SCRIPT", script)
    phase = _phase("baseline", tmp_path, lab)
    names = ["qwen2.5-7b-util-0.90", "qwen2.5-7b-util-0.60"]
    phases.run_capacity(phase, lab, names, minimum_s=10)
    observations = json.loads((tmp_path / "out" / "kv_cache_observations.json").read_text())
    assert [o["name"] for o in observations["observations"]] == names
    assert observations["plan"].endswith(lab.plan["capacity"]["plan_file"])
    assert phase.result["capacity_runs"][",".join(names)] == "exit 0"


def test_capacity_runs_are_skipped_when_the_phase_lacks_time(tmp_path: Path, lab: StandInLab) -> None:
    phase = _phase("defaults", tmp_path, lab, budget_s=100)
    phases.run_capacity(phase, lab, ["x"], minimum_s=200)
    assert phase.result["capacity_runs"]["skipped"]["runs"] == ["x"]
    assert not (tmp_path / "out" / "kv_cache_observations.json").exists()


def test_defaults_phase_runs_its_levels_before_a_warm_restart_the_stack_phase_had_no_time_for(
    tmp_path: Path, lab: StandInLab
) -> None:
    phases.SHARED_CACHE_DIR.mkdir(parents=True)  # the stack phase's cold start filled it
    (phases.WORK_DIR / "stack-cold-done").write_text("205")
    phase = _phase("defaults", tmp_path, lab)
    phases.phase_defaults(phase, lab)
    phase.finish("completed")
    result = json.loads((tmp_path / "out" / "defaults.json").read_text())
    assert set(result["levels"]) == {"1", "4"}
    assert 0 < result["warm_start_s"] < 60
    assert list(result["starts"])[:2] == ["defaults", "stack-warm"]
    assert (phases.WORK_DIR / "warm-start-done").exists()


def test_defaults_phase_makes_no_warm_restart_without_the_stack_phases_cold_start(
    tmp_path: Path, lab: StandInLab
) -> None:
    phases.SHARED_CACHE_DIR.mkdir(parents=True)  # filled by other starts, not the stack's compile
    phase = _phase("defaults", tmp_path, lab)
    phases.phase_defaults(phase, lab)
    phase.finish("completed")
    result = json.loads((tmp_path / "out" / "defaults.json").read_text())
    assert "stack-warm" not in result["starts"] and "warm_start_s" not in result


def test_no_start_is_begun_without_the_time_a_vllm_start_takes(
    tmp_path: Path, lab: StandInLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    (phases.WORK_DIR).mkdir(parents=True, exist_ok=True)
    (phases.WORK_DIR / "stack-cold-done").write_text("205")
    phase = _phase("defaults", tmp_path, lab, budget_s=120)
    monkeypatch.setattr(phases, "EXPECTED_START_S", {"health": 119.0, "kv": 119.0})
    phases.phase_defaults(phase, lab)
    phase.finish("completed")
    result = json.loads((tmp_path / "out" / "defaults.json").read_text())
    assert set(result["levels"]) == {"1", "4"}, "the comparison itself still runs"
    assert list(result["starts"]) == ["defaults"]
    assert any(step["step"].startswith("warm restart skipped") for step in result["steps"])
    assert all("skipped" in probe for probe in result["kv_probes"].values())


def test_warmstart_phase_measures_a_cold_then_a_warm_start_with_requests_after_each(
    tmp_path: Path, lab: StandInLab
) -> None:
    stale = phases.SHARED_CACHE_DIR / "torch_compile_cache" / "old"
    stale.mkdir(parents=True)
    phase = _phase("warmstart", tmp_path, lab)
    phases.phase_warmstart(phase, lab)
    phase.finish("completed")
    result = json.loads((tmp_path / "out" / "warmstart.json").read_text())
    assert not stale.exists(), "the cold start began on an empty shared cache"
    assert list(result["starts"]) == ["stack-cold", "stack-warm"]
    assert 0 < result["cold_start_s"] < 60 and 0 < result["warm_start_s"] < 60
    for name in ("stack-cold", "stack-warm"):
        assert result["first_requests"][name]["completed"] == phases.WARMUP["num_prompts"]
        assert name in result["shared_cache_after"] and name in result["pod_folders_after"]
    assert result["env"]["FLASHINFER_WORKSPACE_BASE"].startswith("{shared_cache}/")
    assert (phases.WORK_DIR / "warm-start-done").exists()
    assert _no_registered_groups()


def test_folder_inventory_counts_files_and_bytes_per_folder(tmp_path: Path) -> None:
    (tmp_path / "jit" / "flashinfer" / "90a").mkdir(parents=True)
    (tmp_path / "jit" / "flashinfer" / "90a" / "sampling.so").write_bytes(b"x" * 1000)
    (tmp_path / "jit" / "flashinfer" / "90a" / "sampling.o").write_bytes(b"x" * 24)
    (tmp_path / "top.json").write_text("{}")
    inventory = phases.folder_inventory(tmp_path, depth=2)
    assert inventory == {".": {"files": 1, "bytes": 2}, "jit/flashinfer": {"files": 2, "bytes": 1024}}
    assert phases.folder_inventory(tmp_path / "absent") == {}


def test_an_empty_capacity_list_runs_nothing(
    tmp_path: Path, lab: StandInLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    # measure_kv_cache.py runs every planned run when it gets no --only (2026-11-29: all of them ran).
    called = tmp_path / "called"
    script = tmp_path / "measure_kv_cache.py"
    script.write_text(f"open({str(called)!r}, 'w').write('ran')\n")
    monkeypatch.setattr(phases, "CAPACITY_SCRIPT", script)
    phase = _phase("baseline", tmp_path, lab)
    phases.run_capacity(phase, lab, [], minimum_s=10)
    assert not called.exists()
    assert phase.result["capacity_runs"] == {"not_run": "none requested"}


def test_transformers_gets_the_phase_budget_when_no_capacity_runs_follow(
    tmp_path: Path, lab: StandInLab
) -> None:
    lab.plan["capacity"]["runs"]["baseline"] = []
    phase = _phase("baseline", tmp_path, lab, budget_s=400)
    phases.phase_baseline(phase, lab)
    started = next(step["step"] for step in phase.result["steps"] if step["step"].startswith("Transformers"))
    budget = float(started.split("budget ")[1].split(" s")[0])
    assert budget >= 370, started
    assert phase.result["capacity_runs"] == {"not_run": "none requested"}
    assert phase.result["host"]["cpu"]["host_cpus"] == os.cpu_count()
