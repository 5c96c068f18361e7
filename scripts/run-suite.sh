#!/usr/bin/env bash
# `make test`: set up everything the suite needs and run it, in two lanes, so that a 2-core machine
# spends its waits on work (tools/README.md "CI time" has the measurements):
#
#   tools   tools/build.sh builds the deploy tests' Go programs (about 45 min on an empty machine,
#           a second when its cache is warm), started first, beside the Python set-up;
#   cluster the deploy tests (`-m cluster`), started as soon as the Go programs are there;
#   main    every other test (`-m "not cluster"`), started as soon as the Python set-up is done:
#           its vLLM, router and Prometheus servers mostly wait, so it runs beside the other lanes.
#
# The main lane prints as it runs; the cluster lane's output follows it (also in
# out/test-run/cluster.log). The last line sums both lanes' counts.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
runs=out/test-run
rm -rf "$runs"
mkdir -p "$runs"
bin=.venv/bin
started=$SECONDS
stamp() { echo "run-suite: $* at $((SECONDS - started)) s"; }

# Lane "tools": the Go programs. build.sh names any program it could not build; the deploy tests
# that need it then skip with that reason (tests/cluster/fixtures.py).
(
  bash tools/build.sh >"$runs/tools-build.log" 2>&1
  echo $? >"$runs/tools-build.rc"
) &
tools_lane=$!

# The Python side: virtualenvs, promtool, vLLM's CPU build, checkov, the router, the preloader image.
if ! make --no-print-directory setup || ! bash scripts/setup-test-tools.sh; then
  echo "run-suite: the test set-up failed (above)" >&2
  kill "$tools_lane" 2>/dev/null
  exit 1
fi
stamp "python set-up done"
# Lint, and the layers' import contracts (pyproject.toml [tool.importlinter], docs/architecture.md):
# an import against a layer fails here, with the contract and the import that breaks it.
{ "$bin/ruff" check . && "$bin/ruff" format --check . && "$bin/lint-imports" --no-cache --no-logo; } ||
  { kill "$tools_lane" 2>/dev/null; exit 1; }

pytest_lane() { # name, pytest arguments...
  local name="$1"
  shift
  "$bin/python" -m pytest --durations=25 --junitxml="$runs/$name.xml" "$@" tests model-cache/tests
}

# Lane "cluster": waits for the tools lane (bounded by the CI budget), then the deploy tests.
(
  wait_until=$((SECONDS + 80 * 60))
  while [ ! -f "$runs/tools-build.rc" ] && [ "$SECONDS" -lt "$wait_until" ]; do sleep 5; done
  cat "$runs/tools-build.log"
  echo "run-suite: tools lane ended (rc $(cat "$runs/tools-build.rc" 2>/dev/null || echo 'none: timed out'))" \
    "at $((SECONDS - started)) s; deploy tests start"
  pytest_lane cluster -m cluster
  echo $? >"$runs/cluster.rc"
) >"$runs/cluster.log" 2>&1 &
cluster_lane=$!

stamp "main lane starts"
pytest_lane main -m "not cluster"
main_rc=$?
stamp "main lane done (rc $main_rc); waiting for the cluster lane"
wait "$cluster_lane"
echo "===================== cluster lane (deploy tests; $runs/cluster.log) ====================="
cat "$runs/cluster.log"
cluster_rc="$(cat "$runs/cluster.rc" 2>/dev/null || echo 1)"
stamp "both lanes done (main rc $main_rc, cluster rc $cluster_rc)"
# Both lanes' counts from their JUnit reports, as one closing line.
"$bin/python" - "$runs/main.xml" "$runs/cluster.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ElementTree

counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for path in sys.argv[1:]:
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as error:
        print(f"run-suite: no JUnit report {path}: {error}")
        counts["errors"] += 1
        continue
    for suite in root.iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
failed = counts["failures"] + counts["errors"]
passed = counts["tests"] - failed - counts["skipped"]
print(f"suite: {passed} passed, {failed} failed, {counts['skipped']} skipped")
EOF
# pytest's 5 ("no tests collected") is a failure here: every lane has tests.
[ "$main_rc" -eq 0 ] && [ "$cluster_rc" -eq 0 ]
