#!/usr/bin/env bash
# The lab GPU session: stage vLLM 0.26.0, then run the serving benchmark (bench/serving) and the
# capacity planner's KV-cache ground truth (bench/capacity) side by side, one lane per GPU.
#
# From the repository root on the GPU host (device tool `run`), one step per call:
#   bash bench/lab_session.sh stage NN        # carry .gpu/pNN: copies the part into /tmp/parts
#   bash bench/lab_session.sh install         # carry .gpu/p06 + .gpu/bin: install + model dirs
#   bash bench/lab_session.sh A               # lane 0: serving `stack` phase; lane 1: KV probes
#   bash bench/lab_session.sh B               # lane 0: serving `defaults`; lane 1: Transformers baseline
# On a one-GPU host both lanes of a step run one after the other (LAB_LANES=serial).
#
# Each lane sees only its GPU (CUDA_VISIBLE_DEVICES, and an nvidia-smi that reports only that GPU,
# because the scripts wait for "their" GPU to be free before each vLLM start). Everything a step
# produced is packed into $OUT/<step>.tar.gz (the device tool returns at most 8 files).
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 2
step=${1:?usage: lab_session.sh stage NN | install | A | B}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# Never NVLink multicast on shared lab hosts (the device tool's KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID
lab=/tmp/lab
out=${OUT:-$lab/out}
mkdir -p "$lab" "$out"
say() { echo "$(date +%T) lab: $*"; }

case "$step" in
  stage)
    part=${2:?part number}
    mkdir -p /tmp/parts && cp .gpu/p"$part"/part* /tmp/parts/ && ls -l /tmp/parts
    exit $? ;;
  install)
    cp .gpu/p06/part* /tmp/parts/ 2>/dev/null
    bash .gpu/bin/install.sh /tmp/parts /tmp/site || exit 1
    mkdir -p /tmp/gpubin && cp .gpu/bin/* /tmp/gpubin/
    python3 /tmp/gpubin/mkmodel.py /tmp/m/llama8b || exit 1
    PYTHONPATH=/tmp/site python3 bench/capacity/mkshape.py qwen2.5-7b /tmp/m/qwen7b --tokenizer-from /tmp/m/llama8b || exit 1
    nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv
    python3 -c "import torch; print('cuda devices', torch.cuda.device_count(), torch.__version__)"
    exit 0 ;;
  A|B) ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac

export PYTHONPATH=/tmp/site
real_smi=$(command -v nvidia-smi)
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
mode=${LAB_LANES:-$([ "$gpus" -ge 2 ] && echo parallel || echo serial)}
# The serving phases may also run the capacity probes; lane 1 runs those here, so give the
# serving phases a plan without them.
python3 - <<'EOF'
import json
plan = json.load(open("bench/serving/plan.json"))
plan["capacity"]["runs"] = {name: [] for name in plan["capacity"]["runs"]}
json.dump(plan, open("/tmp/lab/serving-plan.json", "w"))
EOF

lane() {  # lane INDEX GPU COMMAND...: run COMMAND seeing only GPU, with its own work dirs
  local index=$1 gpu=$2
  shift 2
  local dir=$lab/lane$index
  mkdir -p "$dir/bin" "$dir/out" "$dir/work"
  printf '#!/bin/sh\nexec %s -i %s "$@"\n' "$real_smi" "$gpu" > "$dir/bin/nvidia-smi"
  chmod +x "$dir/bin/nvidia-smi"
  (
    export PATH="$dir/bin:$PATH" CUDA_VISIBLE_DEVICES=$gpu OUT=$dir/out BENCH_WORK_DIR=$dir/work \
      BENCH_SHARED_CACHE=$dir/vllm-cache VLLM_CACHE_ROOT=$dir/vllm-cache
    "$@"
  ) > "$dir/$step.log" 2>&1
  say "lane $index ($*) exited $?"
}

kv_probes() {
  timeout -k 10 470 python3 bench/capacity/measure_kv_cache.py bench/capacity/kv_cache_plan.json \
    --out "$OUT/kv_cache_observations.json" --log-dir "$BENCH_WORK_DIR/capacity-logs" "$@"
}

serving_phase() {  # serving_phase NAME BUDGET_S
  timeout -k 10 $(($2 + 50)) python3 -m bench.serving.phases "$1" --out "$OUT" --budget-s "$2" \
    --plan /tmp/lab/serving-plan.json
}

second_gpu=$([ "$mode" = parallel ] && echo 1 || echo 0)
say "step $step, $gpus GPU(s), lanes $mode"
if [ "$step" = A ]; then
  lane 0 0 serving_phase stack 400 &
  [ "$mode" = serial ] && wait
  lane 1 "$second_gpu" kv_probes --only llama-3.1-8b-util-0.60 --only qwen2.5-7b-util-0.90 \
    --only qwen2.5-7b-util-0.60 --timeout-seconds 300 &
else
  lane 0 0 serving_phase defaults 330 &
  [ "$mode" = serial ] && wait
  lane 1 "$second_gpu" serving_phase baseline 300 &
fi
while [ -n "$(jobs -r)" ]; do
  sleep 20
  say "running: $(for l in "$lab"/lane*/"$step".log; do printf '%s: %s | ' "${l#$lab/}" "$(tail -n 1 "$l" | cut -c1-150)"; done)"
done
wait
say "packing"
tar czf "$out/$step.tar.gz" -C "$lab" --exclude='*/vllm-cache' --exclude='*/bin' \
  $(cd "$lab" && ls -d lane*/out lane*/"$step".log lane*/work/logs lane*/work/capacity-logs 2>/dev/null)
ls -l "$out"
for l in "$lab"/lane*/"$step".log; do echo "== $l"; tail -n 25 "$l"; done
