#!/usr/bin/env bash
# One lab GPU session step, from the repository root on the GPU host (device tool `run`):
#
#   bash .gpu/lab/lab.sh stage NN            # carry .gpu/pNN: one bundle part into /tmp/parts; with 00
#                                            # also the host facts, the model folder and, in the
#                                            # background, the plan's LoRA adapters and (if a job
#                                            # loads real weights) the real-size checkpoint (mkckpt.py)
#   bash .gpu/lab/lab.sh go BUDGET_S WAIT_S   # (carry the last part + .gpu/bin) install vLLM 0.26.0,
#                                            # start lab.py's whole session in the background with a
#                                            # deadline BUDGET_S from now, then follow it for WAIT_S
#   bash .gpu/lab/lab.sh poll WAIT_S         # follow the session up to WAIT_S (or until it ends)
#   bash .gpu/lab/lab.sh baseline BUDGET_S   # after the session: Transformers generate (baseline.py)
#
# LAB_SESSION=wake_session (on stage 00 and go) runs that list of lab_plan.json instead of "session".
#
# The session runs on between calls (setsid), so the calls only carry the bundle and collect results;
# every go/poll packs everything so far into $OUT/lab-<time>.tar.gz. bench/serving/README.md has the
# calls of a session.
set -u
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export TOKENIZERS_PARALLELISM=false LAB_REPO=$PWD
session=${LAB_SESSION:-session}
out=${OUT:-/tmp/lab/out}
results=/tmp/lab/results
mkdir -p "$out" "$results"
say() { echo "$(date +%T) lab.sh: $*"; }

host_facts() {
  {
    date -u +%FT%TZ; uname -r; nproc; free -g; df -h /tmp
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)'
    echo "torch bytecode files: $(find "$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')" -name '*.pyc' | wc -l)"
    cat /proc/loadavg
  } > "$results/host.txt" 2>&1
}

pack() {
  local name=lab-$(date +%H%M%S).tar.gz
  rm -f "$out"/lab-*.tar.gz
  tar czf "$out/$name" -C "$results" --exclude='*.lock' . 2>/dev/null
  ls -l "$out"
}

follow() {  # follow the session's log for up to $1 s, or until lab.py exits
  local until=$(( $(date +%s) + $1 )) seen=0
  while [ "$(date +%s)" -lt "$until" ]; do
    if [ -f "$results/lab.log" ]; then
      local n; n=$(wc -l < "$results/lab.log")
      [ "$n" -gt "$seen" ] && sed -n "$((seen + 1)),${n}p" "$results/lab.log" | grep -E "lab:|Error|error" | cut -c1-220
      seen=$n
    fi
    [ -f "$results/lab.exit" ] && { say "session ended: $(cat "$results/lab.exit")"; break; }
    sleep 5
  done
}

step=${1:?usage: lab.sh stage NN | go BUDGET_S WAIT_S | poll WAIT_S | baseline BUDGET_S}
shift
case "$step" in
  stage)
    mkdir -p /tmp/parts && cp .gpu/p"$1"/part* /tmp/parts/ && ls /tmp/parts | tr '\n' ' '
    if [ "$1" = 00 ]; then
      host_facts
      # While the other parts arrive: the model folder (config + a tokenizer that knows every id the
      # model can emit, bench/serving/mkmodel.py, not the recipe's 16,000-entry one); the LoRA adapters the
      # plan's configurations name (random rank-R tensors of the model's shape, bench/lora); the 16 GB
      # checkpoint only if a job loads real weights.
      read -r lora_count lora_rank needs_ckpt < <(python3 "$here/lab.py" --print-preparation \
        --plan "$here/lab_plan.json" --session "$session")
      setsid nohup bash -c "python3 $LAB_REPO/bench/serving/mkmodel.py /tmp/m/llama8b > $results/mkmodel.log 2>&1 && \
        if [ $lora_count -gt 0 ]; then python3 $LAB_REPO/bench/lora/make_adapters.py /tmp/lora \
          --config-json /tmp/m/llama8b/config.json --rank $lora_rank --count $lora_count \
          > $results/mkadapters.log 2>&1; fi && \
        if [ $needs_ckpt = 1 ]; then python3 $here/mkckpt.py /tmp/m/llama8b /tmp/m/llama8b-real \
          > $results/mkckpt.log 2>&1; fi; echo \$? > $results/mkckpt.exit" > /dev/null 2>&1 < /dev/null &
      say "model folder, $lora_count LoRA adapters (rank $lora_rank), real checkpoint: $needs_ckpt"
    fi
    cat "$results/mkckpt.log" 2>/dev/null; cat "$results/host.txt" 2>/dev/null | head -3
    exit 0 ;;
  go)
    budget=$1 wait=$2
    if [ ! -f /tmp/site/.installed ]; then
      cp .gpu/p*/part* /tmp/parts/ 2>/dev/null
      bash .gpu/bin/install.sh /tmp/parts /tmp/site || exit 1
      touch /tmp/site/.installed
    fi
    for _ in $(seq 1 120); do [ -f "$results/mkckpt.exit" ] && break; sleep 2; done
    say "model, adapters, checkpoint: $(tail -qn1 "$results"/mk*.log 2>/dev/null | tr '\n' ' ') exit $(cat "$results/mkckpt.exit" 2>/dev/null)"
    deadline=$(( $(date +%s) + budget ))
    cp "$here/lab_plan.json" "$results/lab_plan.json"
    setsid nohup bash -c "PYTHONPATH=/tmp/site python3 $here/lab.py --out $results --deadline $deadline --session $session \
      > $results/lab.log 2>&1; echo \$? > $results/lab.exit" > /dev/null 2>&1 < /dev/null &
    say "session started, deadline $(date -d @$deadline +%T)"
    follow "$wait"
    pack ;;
  poll)
    follow "$1"
    pack ;;
  baseline)
    PYTHONPATH=/tmp/site timeout -k 10 $(($1 + 60)) python3 "$here/baseline.py" --model-dir /tmp/m/llama8b \
      --out "$results" --budget-s "$1"
    say "baseline exited $?"
    pack ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
