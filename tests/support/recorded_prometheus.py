"""A real Prometheus (Debian's 2.42 `prometheus`) serving the recorded vLLM series, for PromQL that
must be evaluated by Prometheus' own engine, not by us.

The recording (tests/data/vllm-metrics/load.om, from bench/metrics/capture_vllm_metrics.py) holds
what the vLLM server exported, without target labels. `target_series` adds the labels the
PodMonitor gives each series (namespace, pod, container, model, job, instance) for as many pods as
asked, each pod a copy of the recorded one; `promtool tsdb create-blocks-from openmetrics` turns
that into TSDB blocks, and a Prometheus on loopback with no scrape targets serves them.
`running_prometheus` starts the same Prometheus with any configuration, e.g. scraping a live vLLM
server (tests/e2e/test_autoscaling_live.py).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORDING_DIR = Path(__file__).resolve().parents[1] / "data" / "vllm-metrics"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})? (?P<rest>.+)$")


@dataclass(frozen=True)
class Recording:
    openmetrics: str
    phases: dict[str, tuple[float, float]]
    served_model_name: str

    @classmethod
    def load(cls, directory: Path = RECORDING_DIR) -> Recording:
        meta = json.loads((directory / "phases.json").read_text())
        return cls(
            openmetrics=(directory / "load.om").read_text(),
            phases={name: (start, end) for name, (start, end) in meta["phases"].items()},
            served_model_name=meta["served_model_name"],
        )


def target_series(
    openmetrics: str, *, namespace: str, model: str, pods: Sequence[str], extra: str = ""
) -> str:
    """The recording as Prometheus would store it for `pods` of one model (plus `extra` OpenMetrics
    lines, e.g. synthetic DCGM series, inserted before `# EOF`)."""
    out: list[str] = []
    for line in openmetrics.splitlines():
        if line == "# EOF":
            continue
        match = _SAMPLE.match(line)
        if line.startswith("#") or not match:
            out.append(line)
            continue
        own = (match["labels"] or "{}")[1:-1]
        for pod in pods:
            target = (
                f'namespace="{namespace}",pod="{pod}",container="vllm",model="{model}",'
                f'job="{namespace}/vllm",instance="{pod}:8000"'
            )
            labels = f"{own},{target}" if own else target
            out.append(f"{match['name']}{{{labels}}} {match['rest']}")
    return "\n".join([*out, *([extra] if extra else []), "# EOF", ""])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RecordedPrometheus:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float) -> dict[str, float]:
        """Instant query: {labels as text: value}."""
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        return {
            json.dumps(item["metric"], sort_keys=True): float(item["value"][1]) for item in data["result"]
        }

    def series(self, match: str) -> list[dict[str, str]]:
        """The series a selector matches (what the Prometheus Adapter's discovery asks for)."""
        data: list[dict[str, str]] = self._get("/api/v1/series", {"match[]": match})
        return data

    def scalar(self, expr: str, at: float) -> float | None:
        """An instant query with one series (or none: None)."""
        values = self.query(expr, at)
        assert len(values) <= 1, values
        return next(iter(values.values()), None)


def require_tools() -> tuple[str, str]:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    assert prometheus and promtool, (
        "prometheus and promtool are missing: apt-get install prometheus (scripts/setup-test-tools.sh)"
    )
    return prometheus, promtool


@contextmanager
def recorded_prometheus(openmetrics: str, workdir: Path) -> Iterator[RecordedPrometheus]:
    """A Prometheus on loopback whose TSDB holds exactly `openmetrics`; stopped on exit."""
    _, promtool = require_tools()
    source, data = workdir / "series.om", workdir / "tsdb"
    source.write_text(openmetrics)
    created = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    # The recording is minutes long and in the past: look back over its gaps.
    with running_prometheus(
        "global: {}\nscrape_configs: []\n",
        workdir,
        data,
        ["--storage.tsdb.retention.time=100y", "--query.lookback-delta=5m"],
    ) as server:
        yield server


@contextmanager
def running_prometheus(
    config_yaml: str, workdir: Path, data: Path, flags: Sequence[str] = ()
) -> Iterator[RecordedPrometheus]:
    """Debian's Prometheus on a free loopback port with this configuration, ready; stopped on exit."""
    prometheus, _ = require_tools()
    config = workdir / "prometheus.yml"
    config.write_text(config_yaml)
    port = _free_port()
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            *flags,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base_url}/-/ready", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert process.poll() is None, (workdir / "prometheus.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "Prometheus did not become ready within 120 s"
            time.sleep(0.5)
        yield RecordedPrometheus(base_url)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        log.close()
