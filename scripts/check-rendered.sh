#!/usr/bin/env bash
# Render every stack offline and run the checks nobody here wrote over what would be deployed:
#   1. kubernetes-validate --strict against the stack's cluster.kubernetes_version
#   2. checkov --framework kubernetes, judged against checkov/skips.yaml (new failures and stale skips fail)
#   3. the policy pack's rules (policy/vllm_policies.py) over the rendered resources
# The same checks run in the test suite (tests/test_schema_validation.py, test_security_scan.py,
# test_policy_pack.py); this script shows their raw output for one local run.
#
#   scripts/check-rendered.sh [OUT_DIR]        (default: out; renders to OUT_DIR/<stack>)
#
# Needs .venv (make setup) and .venv-checkov (scripts/setup-checkov.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-out}"
bin=.venv/bin
failed=0

stacks=()
for file in stacks/Pulumi.*.yaml; do
    stack="${file#stacks/Pulumi.}"
    stacks+=("${stack%.yaml}")
done

for stack in "${stacks[@]}"; do
    echo "== $stack: render"
    "$bin/vllm-platform" render "$stack" --out "$out/$stack"
    version="$("$bin/python" -c "import sys; from domain.config import load_stack; print(load_stack(sys.argv[1]).cluster.kubernetes_version)" "$stack")"
    echo "== $stack: kubernetes-validate --strict -k $version"
    # Custom resources have no schema here: kubernetes-validate prints WARN for them. The reviewed
    # allow-list and the CRs' field checks are in tests/test_schema_validation.py.
    mapfile -t manifests < <(find "$out/$stack/kubernetes" "$out/$stack/charts" -name '*.yaml' | sort)
    if ! "$bin/kubernetes-validate" --strict --quiet -k "$version" "${manifests[@]}"; then
        failed=1
    fi
done

echo "== checkov (all stacks in one run; skips: checkov/skips.yaml)"
dirs=()
for stack in "${stacks[@]}"; do dirs+=("$out/$stack/kubernetes" "$out/$stack/charts"); done
if ! "$bin/python" scripts/checkov_gate.py "${dirs[@]}"; then
    failed=1
fi

echo "== policy pack rules over the rendered resources"
if ! "$bin/python" - "${stacks[@]}" <<'PY'
import sys

from infra.render import render_stack
from policy.vllm_policies import Resource, run_rules

failures = 0
for stack in sys.argv[1:]:
    result = render_stack(stack)
    records = [r for r in result.resources if r.custom] + result.chart_resources
    resources = [Resource(r.type, r.name, r.inputs, r.urn) for r in records]
    violations = run_rules(resources)
    print(f"{stack}: {len(resources)} resources, {len(violations)} violations")
    for rule, violation in violations:
        print(f"  [{rule}] {violation}")
    failures += len(violations)
sys.exit(1 if failures else 0)
PY
then
    failed=1
fi

if [[ $failed -ne 0 ]]; then
    echo "check-rendered: FAILED (see above)"
    exit 1
fi
echo "check-rendered: all stacks pass schema, checkov and policy checks"
