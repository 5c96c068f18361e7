#!/usr/bin/env bash
# Prefix-aware against round-robin through vLLM's router (issue 18, item 5; docs/routing.md).
#
#   bash bench/router/run.sh gpu [PREFIXES PROMPTS]   # lab H200: two vLLM 0.26.0 replicas on GPU 0,
#                                  # each --gpu-memory-utilization 0.45, Llama-3.1-8B shape, dummy
#                                  # weights; 32 prefixes / 1200 prompts unless given (256 2000: the
#                                  # prefixes outgrow one replica's KV cache)
#   bash bench/router/run.sh cpu   # rehearsal here: the vLLM 0.32.0 CPU build and the tiny test model
#
# Both modes: start replica 1 (port 8101), then replica 2 (8102); for each policy (round_robin,
# then cache_aware) start the pinned router over both replicas as a router pod's per-model router
# runs (single-model mode, components/router.py), reset both prefix caches, and run vLLM's own
# client through the router: `vllm bench serve --dataset-name prefix_repetition` (NUM_PREFIXES
# shared prefixes of PREFIX_LEN tokens, each prompt one of them plus SUFFIX_LEN own tokens).
# Results (vLLM's JSON per policy, the replicas' prefix-cache counters, the router's metrics, the
# logs) go to $OUT (device tool) or bench/router/results/raw-<mode>/; summarize.py prints the table.
#
# GPU host prerequisites (bench/serving/README.md): vLLM 0.26.0 installed at /tmp/site and the
# model directory /tmp/m/llama8b (bench/serving/lab.sh stage NN for each part, then its install step), and the router wheels
# carried as .gpu/router/ (bash bench/router/stage.sh .gpu/router, on a machine with PyPI).
set -u
mode=${1:?usage: run.sh gpu|cpu [PREFIXES PROMPTS]}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo" || exit 2
out=${OUT:-$repo/bench/router/results/raw-$mode}
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# /reset_prefix_cache is a dev-mode route of vLLM; the benchmark resets both caches between policies.
export VLLM_SERVER_DEV_MODE=1
say() { echo "$(date +%T) router-bench: $*"; }

case "$mode" in
  gpu)
    python=python3
    router_python=python3
    mkdir -p /tmp/router-site
    python3 -m pip install --quiet --no-deps --no-index --target /tmp/router-site .gpu/router/*.whl || exit 1
    export PYTHONPATH="/tmp/router-site:/tmp/site:$repo"
    model=/tmp/m/llama8b
    serve_args=(--gpu-memory-utilization 0.45 --max-model-len 8192 --max-num-seqs 256 --load-format dummy
                --enable-prefix-caching)
    bench_args=(--prefix-repetition-prefix-len 2048 --prefix-repetition-suffix-len 128
                --prefix-repetition-num-prefixes "${2:-32}" --prefix-repetition-output-len 128
                --num-prompts "${3:-1200}" --max-concurrency 64)
    start_timeout=400
    ;;
  cpu)
    python=.venv-vllm/bin/python
    router_python=.venv-router/bin/python
    export PYTHONPATH="$repo" VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 TOKENIZERS_PARALLELISM=false
    model=$work/tiny
    $python -m tests.support.tiny_model "$model" || exit 1
    # vLLM 0.32.0 serves /v1/*/render (what the router's cache_aware policy tokenizes with) only with
    # --enable-scale-out, as the stack sets for cache_aware models; 0.26.0 (gpu) always serves it.
    serve_args=(--max-model-len 1024 --enforce-eager --load-format dummy --enable-prefix-caching
                --enable-scale-out)
    bench_args=(--prefix-repetition-prefix-len 512 --prefix-repetition-suffix-len 16
                --prefix-repetition-num-prefixes 4 --prefix-repetition-output-len 4
                --num-prompts 24 --max-concurrency 2)
    start_timeout=400
    ;;
  *) echo "usage: run.sh gpu|cpu" >&2; exit 2 ;;
esac

pids=()
cleanup() { for pid in "${pids[@]}"; do kill -- -"$pid" 2>/dev/null; done; rm -rf "$work"; }
trap cleanup EXIT

wait_for() {  # URL TIMEOUT PID
  local deadline=$(( $(date +%s) + $2 ))
  until curl -sf -o /dev/null "$1"; do
    kill -0 "$3" 2>/dev/null || { say "process $3 exited before $1 answered"; return 1; }
    [ "$(date +%s)" -lt "$deadline" ] || { say "timeout waiting for $1"; return 1; }
    sleep 2
  done
}

for port in 8101 8102; do
  say "starting replica on $port"
  setsid $python bench/router/vllm_cli.py serve "$model" --served-model-name llama "${serve_args[@]}" \
    --host 127.0.0.1 --port $port > "$out/vllm-$port.log" 2>&1 &
  pids+=($!)
  wait_for "http://127.0.0.1:$port/health" "$start_timeout" "${pids[-1]}" || exit 1
done
grep -h "GPU KV cache size\|KV cache" "$out"/vllm-*.log | tail -2
# The render route the cache_aware policy needs (without it the policy silently matches nothing).
for port in 8101 8102; do
  say "render on $port: HTTP $(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
    -d '{"model":"llama","prompt":"hello"}' "http://127.0.0.1:$port/v1/completions/render")"
done | tee "$out/render-probe.txt"

prefix_counters() {  # the replicas' prefix-cache counters and request counts, as JSON
  $python - "$@" <<'PY'
import json, sys, urllib.request
out = {}
for port in (8101, 8102):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    values = {}
    for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total"):
        values[name] = sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{"))
    out[str(port)] = values
print(json.dumps(out))
PY
}

for policy in round_robin cache_aware; do
  say "router with policy $policy"
  # The model's router as in a router pod (route-<model>: single-model mode, the policy under test);
  # the front's model-name hop in front of it is a localhost proxy and is left out.
  setsid $router_python -m vllm_router.launch_router --worker-urls http://127.0.0.1:8101 http://127.0.0.1:8102 \
    --policy "$policy" --host 127.0.0.1 --port 8200 --prometheus-host 127.0.0.1 --prometheus-port 8201 \
    --health-check-interval-secs 5 > "$out/router-$policy.log" 2>&1 &
  router_pid=$!
  pids+=($router_pid)
  wait_for http://127.0.0.1:8200/liveness 60 $router_pid || exit 1
  for port in 8101 8102; do curl -sf -X POST "http://127.0.0.1:$port/reset_prefix_cache" || exit 1; done
  prefix_counters > "$out/$policy-counters-before.json"
  $python bench/router/vllm_cli.py bench serve --backend vllm --base-url http://127.0.0.1:8200 \
    --endpoint /v1/completions --model llama --tokenizer "$model" --dataset-name prefix_repetition \
    "${bench_args[@]}" --ignore-eos --seed 0 --percentile-metrics ttft,tpot,itl,e2el \
    --save-result --result-dir "$out" --result-filename "$policy.json" > "$out/bench-$policy.log" 2>&1 \
    || { tail -20 "$out/bench-$policy.log"; exit 1; }
  prefix_counters > "$out/$policy-counters-after.json"
  curl -s http://127.0.0.1:8201/metrics > "$out/router-$policy-metrics.txt"
  kill -- -$router_pid; wait $router_pid 2>/dev/null
  say "$policy done: $(grep -h 'Output token throughput' "$out/bench-$policy.log")"
done
$python bench/router/summarize.py "$out" | tee "$out/summary.md"
