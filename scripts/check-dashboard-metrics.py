#!/usr/bin/env python3
"""Check Grafana dashboard JSON files against the metrics the pinned exporters export.

    .venv/bin/python scripts/check-dashboard-metrics.py DASHBOARD.json [...]

Prints every panel query or variable that names a series the pinned vLLM, DCGM exporter or
kube-state-metrics does not export (tests/support/promql_names.py) and exits 1 if there is one.
For dashboards this stack does not ship (e.g. the upstream vLLM or NVIDIA dashboards) before
importing them into Grafana; ours are checked by tests/test_dashboards.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.dashboards import dashboard_expressions
from tests.support.promql_names import unknown_series


def main(paths: list[str]) -> int:
    found = 0
    for path in paths:
        dashboard = json.loads(Path(path).read_text())
        for where, expr in dashboard_expressions(dashboard):
            try:
                unknown = unknown_series(expr)
            except (ValueError, RuntimeError) as error:  # promql-parser's parse error
                print(f"{path}: {where}: does not parse: {error}")
                found += 1
                continue
            if unknown:
                found += 1
                print(f"{path}: {where}: not exported by the pinned exporters: {', '.join(sorted(unknown))}")
    print(f"{found} problem(s) in {len(paths)} dashboard(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
