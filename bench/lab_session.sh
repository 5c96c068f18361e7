#!/usr/bin/env bash
# The lab GPU session: stage vLLM 0.26.0, then run the GPU benchmarks side by side, one lane per GPU.
# The three 2026-11-29 runs measured every step's targets; bench/NEXT_GPU_SESSION.md has the exact
# calls, carry lists and minutes of a session:
#
# From the repository root on the GPU host (device tool `run`), one step per call:
#   bash bench/lab_session.sh stage NN   # carry .gpu/pNN: copies the part into /tmp/parts
#   bash bench/lab_session.sh stage tools  # carry .gpu/tools: py-spy into /tmp/gpubin (stall dumps)
#   bash bench/lab_session.sh install    # carry .gpu/p06 + .gpu/bin: install + model dirs
#   bash bench/lab_session.sh A          # lane 0: serving `defaults` (levels 64 and 256 first);
#                                        # lane 1: Transformers baseline (every batch that fits)
#   bash bench/lab_session.sh B          # lane 0: serving `warmstart` (cold, then warm, with the
#                                        # JIT caches in the shared cache); lane 1: tensor_parallel tp1
#   bash bench/lab_session.sh C          # tensor_parallel tp2 (the stack's arguments) on both GPUs;
#                                        # if it fails or stalls and >= TP2_DIAGNOSIS_MIN_S (200 s) of
#                                        # TP2_BUDGET_S (480 s) are left, tp2-nofuse after it (the lab
#                                        # diagnosis without the fused all-reduce + RMSNorm)
#   bash bench/lab_session.sh D          # tensor_parallel tp2-nccl alone (TP2_NCCL_BUDGET_S, 480 s):
#                                        # the lab diagnosis, NCCL all-reduce only
# Each lane stops starting work after LANE_BUDGET_S (430 s) and is killed 40-55 s later: a step
# ends within 8.5 minutes. On a one-GPU host the lanes run one after the other (LAB_LANES=serial),
# which does not fit one call: run one lane per call there with LAB_LANE=0 or 1 (NEXT_GPU_SESSION.md).
#
# Each lane sees only its GPU (CUDA_VISIBLE_DEVICES, and an nvidia-smi that reports only that GPU,
# because the scripts wait for "their" GPU to be free before each vLLM start) and, where the host
# has the CPUs, half of its physical cores (LAB_CPU_SPLIT=0: all): on 2026-11-29 the Transformers
# baseline decoded at 84 ms a token while the other lane compiled vLLM on the same CPUs.
# BENCH_OTHER_LANE tells each lane what runs beside it (recorded in its output). Everything a step
# produced is packed into $OUT/<step>.tar.gz (the device tool returns at most 8 files).
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 2
step=${1:?usage: lab_session.sh stage NN|tools | install | A | B | C | D}
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
    part=${2:?part number or tools}
    if [ "$part" = tools ]; then  # py-spy (static binary) for run.py's stall dumps
      mkdir -p /tmp/gpubin && cp .gpu/tools/* /tmp/gpubin/ || exit 1
      for tool in .gpu/tools/*; do chmod +x "/tmp/gpubin/$(basename "$tool")"; done
      /tmp/gpubin/py-spy --version
      exit $?
    fi
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
  A|B|C|D) ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac

export PYTHONPATH=/tmp/site
real_smi=$(command -v nvidia-smi)
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
mode=${LAB_LANES:-$([ "$gpus" -ge 2 ] && echo parallel || echo serial)}
# The serving phases' plan with two lab-only changes: no capacity runs (measured 2026-11-29), and
# port 8100, so that the tensor-parallel run on the other GPU can have the stack's 8000.
python3 - <<'EOF'
import json
plan = json.load(open("bench/serving/plan.json"))
plan["capacity"]["runs"] = {name: [] for name in plan["capacity"]["runs"]}
plan["lab"]["port"] = 8100
for args in [plan["lab"]["serve_args"], plan["defaults"]["serve_args"], *(p["serve_args"] for p in plan["probes"])]:
    args[args.index("--port") + 1] = "8100"
json.dump(plan, open("/tmp/lab/serving-plan.json", "w"))
EOF
lane_budget=${LANE_BUDGET_S:-430}

# CPU halves: the host's physical cores split in two, each with its hyperthreads; one per lane.
cpu_halves=$(python3 - <<'EOF'
import glob, os
cores = {}
for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/core_id"):
    cpu = int(path.split("/")[5][3:])
    if cpu in os.sched_getaffinity(0):
        package = open(os.path.join(os.path.dirname(path), "physical_package_id")).read().strip()
        cores.setdefault((int(package), int(open(path).read())), []).append(cpu)
groups = [sorted(cores[key]) for key in sorted(cores)]
half = len(groups) // 2
if half >= 2:
    print(" ".join(",".join(str(c) for g in part for c in g) for part in (groups[:half], groups[half:])))
EOF
)

lane() {  # lane INDEX GPU OTHER COMMAND...: run COMMAND seeing only GPU, with its own work dirs
  local index=$1 gpu=$2 other=$3
  shift 3
  if [ -n "${LAB_LANE:-}" ] && [ "$LAB_LANE" != "$index" ]; then say "lane $index: not run (LAB_LANE=$LAB_LANE)"; return 0; fi
  local dir=$lab/lane$index cpus=""
  mkdir -p "$dir/bin" "$dir/out" "$dir/work"
  printf '#!/bin/sh\nexec %s -i %s "$@"\n' "$real_smi" "$gpu" > "$dir/bin/nvidia-smi"
  chmod +x "$dir/bin/nvidia-smi"
  if [ "$mode" = parallel ] && [ -z "${LAB_LANE:-}" ] && [ "${LAB_CPU_SPLIT:-1}" != 0 ] \
    && [ -n "$cpu_halves" ] && command -v taskset > /dev/null; then
    cpus=$(echo "$cpu_halves" | cut -d' ' -f$((index + 1)))
  fi
  (
    export PATH="$dir/bin:$PATH" CUDA_VISIBLE_DEVICES=$gpu OUT=$dir/out BENCH_WORK_DIR=$dir/work \
      BENCH_SHARED_CACHE=$dir/vllm-cache VLLM_CACHE_ROOT=$dir/vllm-cache BENCH_OTHER_LANE=$other
    if [ -n "$cpus" ]; then taskset -cp "$cpus" "$BASHPID" > /dev/null && echo "lane $index: CPUs $cpus"; fi
    "$@"
  ) > "$dir/$step.log" 2>&1
  say "lane $index ($*) exited $?"
}

solo() {  # solo NAME COMMAND...: COMMAND on every GPU and CPU, with its own work dirs
  local dir=$lab/$1
  shift
  mkdir -p "$dir/out" "$dir/work"
  ( export OUT=$dir/out BENCH_WORK_DIR=$dir/work; "$@" ) > "$dir/$step.log" 2>&1
  say "$(basename "$dir") ($*) exited $?"
}

serving_phase() {  # serving_phase NAME BUDGET_S
  timeout -k 10 $(($2 + 40)) python3 -m bench.serving.phases "$1" --out "$OUT" --budget-s "$2" \
    --plan /tmp/lab/serving-plan.json
}

tensor_parallel() {  # tensor_parallel BUDGET_S ARGS...: bench/tensor_parallel/run.py (own hard budget)
  local budget=$1
  shift
  timeout -k 15 $((budget + 40)) python3 -m bench.tensor_parallel.run "$@" --out "$OUT" --budget-s "$budget"
}

tp2_then() {  # tp2_then DIAGNOSIS: tp2 as the stack renders it; DIAGNOSIS after it if tp2 did not complete
  local diagnosis=$1 budget=${TP2_BUDGET_S:-480} began=$SECONDS left
  solo tp2 tensor_parallel "$budget" --only tp2
  left=$((budget - (SECONDS - began)))
  if python3 - "$lab/tp2/out/tp.json" <<'EOF'
import json, sys
try:
    status = json.load(open(sys.argv[1]))["runs"]["tp2"]["status"]
except (OSError, ValueError, KeyError):
    status = "no result"
print(f"tp2: {status}")
sys.exit(0 if status == "completed" else 1)
EOF
  then
    say "tp2 completed: no $diagnosis in step $step"
  elif [ "$left" -ge "${TP2_DIAGNOSIS_MIN_S:-200}" ]; then  # to the KV-cache size ~140 s, /health ~230 s
    say "tp2 did not complete; $diagnosis with the $left s left"
    solo "$diagnosis" tensor_parallel "$left" --only "$diagnosis"
  else
    say "tp2 did not complete; $left s left (< ${TP2_DIAGNOSIS_MIN_S:-200}): no $diagnosis in step $step"
  fi
}

second_gpu=$([ "$mode" = parallel ] && echo 1 || echo 0)
beside() { if [ "$mode" = parallel ] && [ -z "${LAB_LANE:-}" ]; then echo "$1"; fi; }  # on the other GPU meanwhile
say "step $step, $gpus GPU(s), lanes $mode, CPU halves: ${cpu_halves:-none}"
case "$step" in
  A)
    lane 0 0 "$(beside 'Transformers baseline (bench.serving.phases baseline)')" \
      serving_phase defaults "$lane_budget" &
    [ "$mode" = serial ] && wait
    lane 1 "$second_gpu" "$(beside 'vLLM defaults phase (bench.serving.phases defaults)')" \
      serving_phase baseline "$lane_budget" & ;;
  B)
    lane 0 0 "$(beside 'tensor_parallel tp1: vLLM, Qwen2.5-7B shape, cold start then C=64')" \
      serving_phase warmstart "$lane_budget" &
    [ "$mode" = serial ] && wait
    lane 1 "$second_gpu" "$(beside 'vLLM warmstart phase (bench.serving.phases warmstart)')" \
      tensor_parallel "$lane_budget" --only tp1 --gpu "$second_gpu" & ;;
  C)
    if [ "$gpus" -lt 2 ]; then echo "step C needs two GPUs; this host has $gpus" >&2; exit 2; fi
    tp2_then tp2-nofuse & ;;  # TP2_BUDGET_S: the whole step's; less when device time is short
  D)
    if [ "$gpus" -lt 2 ]; then echo "step D needs two GPUs; this host has $gpus" >&2; exit 2; fi
    solo tp2-nccl tensor_parallel "${TP2_NCCL_BUDGET_S:-480}" --only tp2-nccl & ;;
esac
while [ -n "$(jobs -r)" ]; do
  sleep 20
  say "running: $(for l in "$lab"/lane*/"$step".log "$lab"/tp2*/"$step".log; do
    [ -f "$l" ] && printf '%s: %s | ' "${l#$lab/}" "$(tail -n 1 "$l" | cut -c1-150)"; done)"
done
wait
say "packing"
# tensor_parallel's server logs are in <work>/bench-tp/logs (run.py's WORK_DIR), its tp.json,
# tp-<variant>-log.txt and tp-<variant>-stall.txt in <dir>/out.
tar czf "$out/$step.tar.gz" -C "$lab" --exclude='*/vllm-cache' --exclude='*/bin' \
  $(cd "$lab" && ls -d lane*/out lane*/"$step".log lane*/work/logs lane*/work/capacity-logs \
    lane*/work/bench-tp/logs tp2*/out tp2*/"$step".log tp2*/work/bench-tp/logs 2>/dev/null)
ls -l "$out"
for l in "$lab"/lane*/"$step".log "$lab"/tp2*/"$step".log; do
  if [ -f "$l" ]; then echo "== $l"; tail -n 25 "$l"; fi
done
