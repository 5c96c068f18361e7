#!/usr/bin/env bash
# One lab GPU session step, from the repository root on the GPU host (device tool `run`):
#
#   bash bench/serving/lab.sh stage NN               # carry .gpu/pNN: one bundle part into /tmp/parts
#   bash bench/serving/lab.sh measure BUDGET CONFIG...  # (carry .gpu/p06 + .gpu/bin the first time:
#                                                    # installs vLLM 0.26.0) then bench/serving/lab.py
#   bash bench/serving/lab.sh baseline BUDGET        # the Transformers baseline, alone
#   bash bench/serving/lab.sh measure 420 tuned stack -- baseline 100   # both in one call
#
# Everything a step wrote is packed into $OUT/lab-<step>-<time>.tar.gz (the device tool returns at
# most 8 files). bench/serving/README.md has the session's calls.
set -u
# Runs from the repository root (the .gpu/ paths are relative to it); the scripts beside this file
# may live elsewhere (the device tool sends the lead's checkout, so a helper carries them in .gpu/).
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export TOKENIZERS_PARALLELISM=false
out=${OUT:-/tmp/lab/out}
results=/tmp/lab/results
mkdir -p "$out" "$results"
say() { echo "$(date +%T) lab.sh: $*"; }

install() {
  [ -f /tmp/site/.installed ] && return 0
  cp .gpu/p06/part* /tmp/parts/ 2>/dev/null
  bash .gpu/bin/install.sh /tmp/parts /tmp/site || exit 1
  python3 .gpu/bin/mkmodel.py /tmp/m/llama8b > /dev/null || exit 1
  touch /tmp/site/.installed
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
}

pack() {
  local name=lab-$1-$(date +%H%M%S).tar.gz
  for f in "$results"/*-server.log; do [ -f "$f" ] && gzip -f "$f"; done
  tar czf "$out/$name" -C "$results" .
  ls -l "$out"
}

step=${1:?usage: lab.sh stage NN | measure BUDGET CONFIG... [-- baseline BUDGET] | baseline BUDGET}
shift
case "$step" in
  stage)
    mkdir -p /tmp/parts && cp .gpu/p"$1"/part* /tmp/parts/ && ls /tmp/parts
    exit $? ;;
  measure)
    install
    budget=$1
    shift
    configs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do configs+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift
    say "load before: $(cat /proc/loadavg); GPU processes: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
    PYTHONPATH=/tmp/site timeout -k 10 $((budget + 40)) python3 "$here/lab.py" --out "$results" \
      --budget-s "$budget" "${configs[@]}" 2>&1 | tee -a "$results/lab.log" | grep --line-buffered -E "lab:|Error"
    say "lab.py exited ${PIPESTATUS[0]}"
    pack measure
    if [ "${1:-}" = baseline ]; then
      PYTHONPATH=/tmp/site timeout -k 10 $(($2 + 40)) python3 "$here/baseline.py" --model-dir /tmp/m/llama8b \
        --out "$results" --budget-s "$2"
      say "baseline exited $?"
      pack baseline
    fi ;;
  baseline)
    install
    trap 'pack baseline' EXIT
    PYTHONPATH=/tmp/site timeout -k 10 $(($1 + 60)) python3 "$here/baseline.py" --model-dir /tmp/m/llama8b \
      --out "$results" --budget-s "$1"
    say "baseline exited $?" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
