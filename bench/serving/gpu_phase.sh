#!/usr/bin/env bash
# One GPU phase of the serving benchmark, from the repository root on the GPU host:
#
#   bash bench/serving/gpu_phase.sh selftest|stack|defaults|baseline|warmstart [--dry-run-cpu]
#   bash bench/serving/gpu_phase.sh all            # selftest + the four phases (~32 min), then analyze
#
# Needs vLLM 0.26.0 importable (PYTHONPATH=/tmp/site), the model directories (/tmp/m/llama8b), and
# writes into $OUT (default $BENCH_WORK_DIR/out, i.e. /tmp/bench-serving/out). Each phase stops starting new work after its
# budget (BENCH_BUDGET_S, default 420 s) and is hard-killed 55 s later, so one phase fits an 8-minute
# command; every vLLM server it started is stopped on any exit (trap below).
# --dry-run-cpu rehearses the same phase on the vLLM 0.32.0 CPU build (.venv-vllm) with a tiny model.
set -u

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo" || exit 2

phase=${1:-}
shift || true
case "$phase" in
  selftest|stack|defaults|baseline|warmstart|all) ;;
  *) echo "usage: bash bench/serving/gpu_phase.sh selftest|stack|defaults|baseline|warmstart|all [--dry-run-cpu]" >&2; exit 2 ;;
esac

dry_run=""
python=${PYTHON:-python3}
for argument in "$@"; do
  case "$argument" in
    --dry-run-cpu)
      dry_run="--dry-run-cpu"; python=${PYTHON:-$repo/.venv-vllm/bin/python}
      export BENCH_SHARED_CACHE=${BENCH_SHARED_CACHE:-${BENCH_WORK_DIR:-/tmp/bench-serving}/vllm-cache} ;;
    *) echo "unknown option $argument" >&2; exit 2 ;;
  esac
done

export BENCH_WORK_DIR=${BENCH_WORK_DIR:-/tmp/bench-serving}
out=${OUT:-$BENCH_WORK_DIR/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
budget=${BENCH_BUDGET_S:-420}
mkdir -p "$BENCH_WORK_DIR"

stop_leftovers() {
  # Process groups the phase registered and did not stop (e.g. after a hard kill).
  local registry="$BENCH_WORK_DIR/process-groups" pgid
  [ -f "$registry" ] || return 0
  for pgid in $(cat "$registry"); do
    if kill -0 -- "-$pgid" 2>/dev/null; then
      echo "$(date +%T) gpu_phase: stopping leftover process group $pgid"
      kill -TERM -- "-$pgid" 2>/dev/null
      sleep 5
      kill -KILL -- "-$pgid" 2>/dev/null
    fi
  done
  : > "$registry"
}
trap stop_leftovers EXIT

run_phase() {
  local name=$1 phase_budget=$2
  echo "$(date +%T) gpu_phase: $name (budget ${phase_budget} s, hard limit $((phase_budget + 55)) s) -> $out"
  timeout -k 10 $((phase_budget + 45)) "$python" -m bench.serving.phases "$name" --out "$out" \
    --budget-s "$phase_budget" $dry_run
  local status=$?
  stop_leftovers
  echo "$(date +%T) gpu_phase: $name exited $status"
  return $status
}

if [ "$phase" = all ]; then
  status=0
  for name in selftest stack defaults baseline warmstart; do
    if [ "$name" = selftest ]; then run_phase "$name" 150 || exit 1; else run_phase "$name" "$budget" || status=1; fi
  done
  "$python" -m bench.serving.analyze --raw "$out" --results "$out/results" || status=1
  exit $status
fi
if [ "$phase" = selftest ]; then budget=${BENCH_BUDGET_S:-150}; fi
run_phase "$phase" "$budget"
