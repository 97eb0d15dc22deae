#!/usr/bin/env bash
# GPU checks and benchmarks in one call (the device machine keeps nothing between calls).
# Usage: bash bench/gpu_suite.sh STAGE...   stages: env tests parity roofline kernels tpot workloadA small llama8b dist_tests tp coldstart coldstart_meta profile sampling parallel int8 int8_workload gateway hosttier kvswap resize tiertrace stepkernels decodekernels gemv gemv_tpot int8variants async qkvprep int8round2 int8mma normfuse int8trace timeline pdl tp_quick dp allreduce stagegraphs pipeline backlog ncclsweep t2timeline t2tail t2gemv t2verify ablation wla kinds_tp sampler_kernels topp_cut topp_profile ab_wla greedyids preload onechunk onechunk_rows symmfail stepinputs greedygraph persistent fusedmlp tpot_kinds coldstart_empty tpot_where
# Writes logs and JSON under ${OUT:-bench/results}.
set -uo pipefail
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30
# Workload A's tail alone (issue 11): SEQS long sequences (prompts U[1500,1800], 300 tokens each),
# decode-only after their prefill. tail_run MODEL T SEQS "ENV=VALUE ..." NAME [bench/throughput.py flags]
tail_run() {
  local model=$1 tp=$2 seqs=$3 env=$4 name=$5; shift 5
  echo "--- $model tail T=$tp, $seqs seqs ${env} $*"
  env $env timeout 120 python3 bench/throughput.py --model "$model" --load-format dummy --dtype bfloat16 \
    --num-seqs "$seqs" --prompt-len 1500 1800 --output-len 300 300 --max-model-len 4096 --hf none \
    --tensor-parallel-size "$tp" --out "$OUT/$name.json" "$@" 2>&1 \
    | grep -E "^infer-cluster|^--- step|^window|compute kernels|^  kernel|Error|error" | head -24
}
tag() { echo "$1" | tr -c 'A-Za-z0-9\n' '_'; }  # an env assignment as a file-name part
# Batch-1 TPOT (bench/latency.py, Qwen3-0.6B shape) once per entry of RUNS (comma-separated env
# settings, "-" for none), in that order, so A/B runs alternate. tpot_alternating RUNS NAME
tpot_alternating() {
  local runs e i=0; IFS=, read -ra runs <<< "$1"
  for e in "${runs[@]}"; do i=$((i + 1)); [ "$e" = - ] && e=""
    echo "--- $i: TPOT ${e:-defaults}"
    env $e timeout 150 python3 bench/latency.py --model qwen3-0.6b-shape --max-model-len 4096 \
      --out "$OUT/${2}_$i.json" 2>&1 | grep -E "tpot_ms_p|ttft_ms\""
  done
}
# Batch-1 TPOT p50 of the engine in TREE (this checkout, or an older one as plain files), with the
# ENV settings. tpot_in_tree TREE OUT_JSON [ENV=VALUE ...]
tpot_in_tree() {
  local tree out; tree=$(cd "$1" && pwd); out=$(realpath -m "$2"); shift 2
  (cd "$tree" && env PYTHONPATH="/tmp/site:$tree" "$@" timeout 150 python3 bench/latency.py --model qwen3-0.6b-shape \
    --max-model-len 4096 --out "$out" 2>&1 | grep -E "tpot_ms_p50")
}
for stage in "$@"; do
  echo "=== $stage $(date -u +%H:%M:%S)"
  case $stage in
    env) python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())"; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv ;;
    tests) python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider 2>&1 | tee "$OUT/gpu_kernel_tests.log" | tail -15 ;;
    parity) python3 -m pytest -q tests/parity/test_gpu.py tests/parity/test_gpu_compiles.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_parity.log" | tail -15 ;;
    roofline) python3 bench/roofline.py --out "$OUT/roofline.json" ;;
    kernels) python3 bench/kernels.py --out "$OUT/kernels.json" 2>&1 | tail -30 ;;
    tpot) python3 bench/latency.py --model qwen3-0.6b-shape --max-model-len 4096 --out "$OUT/tpot_qwen3.json" 2>&1 | tail -8 ;;
    workloadA) python3 bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
        --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf ${HF_MODE:-continuous} --hf-max-seqs ${HF_SEQS:-64} \
        --out "$OUT/workloadA_qwen3.json" 2>&1 | tee "$OUT/workloadA.log" | grep -v "it/s\]" | tail -12 ;;
    small) python3 bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
        --num-seqs 64 --prompt-len 100 300 --output-len 100 300 --hf none --out "$OUT/small.json" 2>&1 | grep -v "it/s\]" | tail -6 ;;
    llama8b) python3 bench/throughput.py --model llama-3-8b-shape --load-format dummy --dtype bfloat16 \
        --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
        --out "$OUT/workloadA_llama8b.json" 2>&1 | grep -v "it/s\]" | tail -8 ;;
    sampling)  # issue 10's table: workload A as greedy / sampled / penalties / logprobs, one engine
      python3 -m pytest -q -m gpu tests/unit/test_sampler.py tests/unit/test_sampling_ops.py tests/kernels/test_random_stream.py tests/kernels/test_row_stats.py -p no:cacheprovider 2>&1 | tail -3
      # no host sync inside Sampler.draw (sync debug mode "error"), and async == sync with redone rows
      python3 -m pytest -q -m gpu -k "sync_debug or async" tests/parity/test_gpu.py -p no:cacheprovider 2>&1 | tail -5
      python3 bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
        --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
        --sampling all --repeats 2 --out "$OUT/sampling_qwen3.json" 2>&1 | grep -v "it/s\]" | tail -13 ;;
    dist_tests) python3 -m pytest -q -m gpu tests/distributed -p no:cacheprovider 2>&1 | tee "$OUT/gpu_dist_tests.log" | tail -15 ;;
    tp)  # workload A at T=1 and T=2 for both shapes (issue 5); needs 2 GPUs
      for model in qwen3-0.6b-shape llama-3-8b-shape; do for tp in 1 2; do
        timeout 150 python3 bench/throughput.py --model $model --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --tensor-parallel-size $tp --out "$OUT/tp${tp}_${model}.json" 2>&1 | grep -E "^infer-cluster|^model=|Error|error" | tail -4
      done; done ;;
    coldstart)  # issue 10: start-up cost, first run vs warm runs, byte-level vs SentencePiece-style text
      for tok in bytelevel metaspace; do
        python3 bench/cold_start.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --tokenizer $tok \
          --out "$OUT/coldstart_$tok.json" 2>&1 | grep -v "it/s\]" | tail -7
      done ;;
    coldstart_meta) python3 bench/cold_start.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --tokenizer metaspace \
          --out "$OUT/coldstart_metaspace.json" 2>&1 | grep -v "it/s\]" | tail -7 ;;
    profile) python3 bench/step_profile.py --out "$OUT/step_profile.json" 2>&1 | tail -3 ;;
    tp_quick)  # issue 11 when little device time is left (one 2-GPU call of ~3 min): workload A,
      # Qwen3-0.6B shape, T=2 (async scheduling on, then off) and T=1, then GPU parity at T=2 with graphs and the killed-rank test.
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      for run in "2 auto" "2 off" "1 auto"; do  # async scheduling auto (on) vs off at T=2
        read -r tp async <<< "$run"
        echo "--- qwen3-0.6b-shape T=$tp async scheduling $async"
        timeout 100 python3 bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --tensor-parallel-size $tp --async-scheduling $async --out "$OUT/quick_t${tp}_${async}_qwen3.json" 2>&1 \
          | tee "$OUT/quick_t${tp}_$async.log" | grep -E "^infer-cluster|^model=|Error|error" | tail -6
      done
      timeout 120 python3 -m pytest -q -m gpu tests/distributed/test_gpu.py -p no:cacheprovider \
        -k "qwen3 and tp2_graphs or graphs and killed" 2>&1 | tee "$OUT/gpu_dist_quick.log" | tail -8 ;;
    dp)  # issue 11 item 5 on 2 GPUs: `serve -dp 1` vs `-dp 2` (T=1 replicas, a GPU each), workload A's
      # request shape through InferenceClient, two rounds each (the first warms up), same call. 1,024
      # requests by default: 256 leave each of 2 replicas a half batch whose round ends with its
      # longest request (2026-11-26: 1.56x at 256), so they measure the tail, not the cluster. Then the
      # same load per replica (--per-replica: 256 requests to one replica, 512 to two).
      timeout 300 python3 bench/dp_scaling.py --dp 1 2 --rounds 2 --num-requests "${DP_REQUESTS:-1024}" --input-len 100:1024 \
        --output-len 100:1024 --log-dir "${DP_LOG_DIR:-$OUT/dp_logs}" --out "$OUT/dp_scaling.json" \
        --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 --max-model-len 4096 2>&1 | tail -5
      timeout 250 python3 bench/dp_scaling.py --dp 1 2 --rounds 2 --num-requests 256 --per-replica --input-len 100:1024 \
        --output-len 100:1024 --log-dir "${DP_LOG_DIR:-$OUT/dp_logs}" --out "$OUT/dp_scaling_per_replica.json" \
        --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 --max-model-len 4096 2>&1 | tail -5 ;;
    parallel)  # issue 11 on nvidia-h200-x2, inside one 10-minute call: GPU distributed tests (graph
      # mode at T=2, P=2 parity, kill paths), then workload A at T=1 vs T=2 (both shapes) and
      # P=1 vs P=2 (8B shape; micro-batches on, the default on CUDA, then off). Each run gets at most what
      # is left of a 570 s budget.
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never multicast
      par_end=$((SECONDS + 570))
      par_left() { local l=$((par_end - SECONDS)); echo $(( l < $1 ? (l > 1 ? l : 1) : $1 )); }
      timeout "$(par_left 240)" python3 -m pytest -q -m gpu tests/distributed -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_dist_tests.log" | tail -6
      for run in "qwen3-0.6b-shape 1 1 auto" "qwen3-0.6b-shape 2 1 auto" "llama-3-8b-shape 1 1 auto" \
                 "llama-3-8b-shape 2 1 auto" "llama-3-8b-shape 1 2 on" "llama-3-8b-shape 1 2 off"; do
        read -r model tp pp mb <<< "$run"
        echo "--- $model T=$tp P=$pp micro-batches $mb (limit $(par_left 120) s)"
        timeout "$(par_left 120)" python3 bench/throughput.py --model "$model" --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --tensor-parallel-size "$tp" --pipeline-parallel-size "$pp" --pipeline-microbatches "$mb" \
          --out "$OUT/par_t${tp}_p${pp}_${mb}_$model.json" 2>&1 \
          | grep -E "^infer-cluster|^model=|Error|error" | tail -4
      done ;;
    int8)  # issue 14 part 1: int8 KV cache. GPU tests, decode bf16 vs int8 in graphs, int8 kernel rows (float rows: stage kernels), workload A auto vs int8
      python3 -m pytest -q -m gpu tests/kernels/test_attention_int8.py tests/kernels/test_kv_append.py \
        tests/parity/test_gpu_int8.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_int8_tests.log" | tail -8
      python3 bench/int8_decode.py --out "$OUT/int8_decode.json" 2>&1 | tail -10
      python3 bench/kernels.py --int8 --only int8 --out "$OUT/kernels_int8.json" 2>&1 | tail -12
      bash "$0" int8_workload ;;
    qkvprep)  # issue 11: fused q/k norm + rotary + KV append. GPU tests, then old vs fused in CUDA graphs (Qwen3-0.6B layer shape)
      python3 -m pytest -q -m gpu tests/kernels/test_qkv_prep.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_qkv_prep_tests.log" | tail -4
      python3 bench/qkv_prep.py --out "$OUT/qkv_prep.json" 2>&1 | tail -12 ;;
    int8_workload)  # workload A, Qwen3-0.6B shape, KV cache auto (bf16) then int8, one engine each
      for kv in auto int8; do
        python3 bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --kv-cache-dtype $kv --out "$OUT/workloadA_qwen3_kv_$kv.json" 2>&1 | tee "$OUT/workloadA_kv_$kv.log" \
          | grep -E "^model=|^infer-cluster|engine time|Error|error" | tail -4
      done ;;
    int8trace)  # issue 14: workload A profiled whole, KV auto then int8: compute idle and gaps, GPU time by
      # kernel family (where the int8 ratio is lost: attention vs what int8 does not change)
      for kv in auto int8; do
        timeout 240 python3 bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --kv-cache-dtype $kv --trace /tmp/int8trace --out "$OUT/int8trace_$kv.json" 2>&1 \
          | grep -v "it/s\]" | grep -vE "^\s*$" | tail -44
      done
      cp /tmp/int8trace/*.summary.json "$OUT/" ;;
    gateway)  # issue 12: what the HTTP gateway adds over ZMQ on a quiet many-core host: the embedded
      # model on the CPU (the issue's setting), then qwen3-0.6b-shape on the GPU. Needs the gateway
      # dependencies (fastapi, uvicorn, uvloop, httptools, prometheus_client, httpx) in the env.
      # GATEWAY_DEVICES picks the runs (default: both); throughput uses 8 rounds per path
      # (3 rounds swung ±13% between runs on 16 cores).
      for spec in "cpu tiny-random" "cuda qwen3-0.6b-shape --load-format dummy --dtype bfloat16 --max-model-len 4096"; do
        set -- $spec; dev=$1; model=$2; shift 2
        case " ${GATEWAY_DEVICES:-cpu cuda} " in *" $dev "*) ;; *) continue ;; esac
        python3 -m infer_cluster serve --port 5655 --http-port 8100 --device $dev --model $model "$@" \
          > "$OUT/gateway_serve_$model.log" 2>&1 &
        serve_pid=$!
        python3 -c "import httpx, time
for _ in range(600):
    try:
        if httpx.get('http://127.0.0.1:8100/health', timeout=2).status_code == 200: break
    except httpx.HTTPError: pass
    time.sleep(0.5)"
        timeout 300 python3 -m infer_cluster --log-level WARNING bench --address tcp://127.0.0.1:5655 \
          --http http://127.0.0.1:8100 -n 5 --concurrency 1 --input-len 32 --output-len 16 --repeat 20 \
          --json "$OUT/gateway_latency_$model.json" 2>&1 | grep -v "^round" | tail -16
        timeout 300 python3 -m infer_cluster --log-level WARNING bench --address tcp://127.0.0.1:5655 \
          --http http://127.0.0.1:8100 -n 128 --concurrency 32 --input-len 32 --output-len 64 --repeat 8 \
          --json "$OUT/gateway_throughput_$model.json" 2>&1 | grep -v "^round" | tail -16
        kill -TERM $serve_pid; wait $serve_pid
      done ;;
    hosttier)  # issue 14 part 2: host KV tier. GPU engine tests (pinned pool, copy stream, graphs), then
      # 256 requests over 16 distinct 4,000-token prefixes, device pool for 4, tier off vs on (Qwen3-0.6B shape, bf16)
      python3 -m pytest -q -m gpu tests/engine/test_host_tier.py -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_host_tier_tests.log" | tail -5
      python3 bench/host_tier.py --out "$OUT/host_tier.json" 2>&1 | tee "$OUT/host_tier.log" | grep -v "it/s\]" | tail -6 ;;
    kvswap)  # issue 14 part 2, copy paths: GPU swap-kernel and pool tests, swap GB/s per path (zero-copy
      # kernel / DMA runs / old CPU gather vs memcpy; bench/kv_swap.py), then the host-tier workload off vs on
      # (KVSWAP_MODES=kernel,runs adds a tier-on run per extra copy path)
      python3 -m pytest -q -m gpu tests/kernels/test_kv_swap.py tests/engine/test_kv_copy.py tests/engine/test_host_tier.py \
        -p no:cacheprovider 2>&1 | tee "$OUT/gpu_kv_swap_tests.log" | tail -5
      python3 bench/kv_swap.py --out "$OUT/kv_swap.json" 2>&1 | tee "$OUT/kv_swap.log" | tail -32
      python3 bench/host_tier.py --copy-modes "${KVSWAP_MODES:-runs}" --out "$OUT/host_tier_kvswap.json" 2>&1 \
        | tee "$OUT/host_tier_kvswap.log" | grep -v "it/s\]" | tail -8 ;;
    resize)  # issue 14 part 3: KV resize between steps with CUDA graphs (re-capture, outputs, memory back)
      python3 -m pytest -q -s -m gpu tests/parity/test_gpu_resize.py -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_resize.log" | grep -E "resize on GPU|passed|failed|Error" | tail -6 ;;
    tiertrace)  # issue 14: the host-tier workload (64 requests) profiled tier off and on: GPU timeline per run
      python3 bench/host_tier.py --num-requests 64 --trace /tmp/tiertrace --out "$OUT/host_tier_trace.json" 2>&1 \
        | grep -v "it/s\]" | tail -40
      cp /tmp/tiertrace/*.summary.json "$OUT/" ;;
    stepkernels)  # issue 14: a workload-A decode step's GPU time by kernel family, KV auto then int8
      for kv in auto int8; do python3 bench/step_kernels.py --kv-cache-dtype $kv 2>&1 | grep -v "it/s\]" | tail -18; done ;;
    decodekernels) python3 bench/decode_kernels.py --steps 10 2>&1 | head -40 ;;
    gemv)  # small-batch GEMV (batch-1 TPOT): GPU tests, the launch-config sweep (its table goes into
      # kernels/gemv_tuned.py; log and JSON under $OUT), then cuBLAS vs the small path with the sweep's picks
      # (GEMV_SWEEP_ARGS, e.g. "--models qwen3-0.6b", narrows the sweep; GEMV_SWEEP_S is its time budget)
      python3 -m pytest -q -m gpu tests/kernels/test_gemv.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_gemv_tests.log" | tail -4
      timeout 240 python3 bench/gemv.py --sweep --budget-s ${GEMV_SWEEP_S:-120} ${GEMV_SWEEP_ARGS:-} --out "$OUT/gemv_sweep.json" 2>&1 \
        > "$OUT/gemv_sweep.log"; grep -E "^precompiled|not swept|Error| s on " "$OUT/gemv_sweep.log" | tail -6
      tuned=(); [ -s "$OUT/gemv_sweep.json" ] && tuned=(--tuned "$OUT/gemv_sweep.json")
      timeout 150 python3 bench/gemv.py ${tuned[@]+"${tuned[@]}"} --out "$OUT/gemv.json" 2>&1 \
        | tee "$OUT/gemv.log" | tail -16 ;;
    gemv_tpot)  # batch-1 TPOT with the small path off, then on (A/B through INFER_CLUSTER_GEMV)
      for g in 0 1; do echo "--- INFER_CLUSTER_GEMV=$g"
        INFER_CLUSTER_GEMV=$g python3 bench/latency.py --model qwen3-0.6b-shape --max-model-len 4096 \
          --out "$OUT/tpot_qwen3_gemv$g.json" 2>&1 | tail -8
      done ;;
    int8variants)  # issue 14: int8 decode kernel variants (operand conversion, tiles, split-K): GPU int8
      # attention tests (every cvt mode), then each variant vs the bf16 kernel in CUDA graphs on the
      # tuner's b256/b32/b1 cases; prints the fastest correct variant per case and overall and the
      # DECODE_INT8 line that makes it the default
      timeout 170 python3 -m pytest -q -m gpu tests/kernels/test_attention_int8.py -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_int8_attention_tests.log" | tail -6
      timeout 390 python3 bench/int8_decode.py --variants --iters 30 --out "$OUT/int8_variants.json" 2>&1 \
        | tee "$OUT/int8_variants.log" | tail -80 ;;
    async)  # issue 11 item 3: async scheduling. GPU parity tests (they run with the default, auto =
      # on), then batch-1 TPOT and workload A (the workloadA stage without HF) with it off and on
      python3 -m pytest -q tests/parity/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_parity_async.log" | tail -4
      for mode in off on; do
        python3 bench/latency.py --model qwen3-0.6b-shape --max-model-len 4096 --async-scheduling $mode \
          --out "$OUT/tpot_qwen3_async_$mode.json" 2>&1 | grep -E "async|tpot|ttft" | tr -d '\n'; echo
      done
      for mode in off on; do
        python3 bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --async-scheduling $mode --out "$OUT/workloadA_qwen3_async_$mode.json" 2>&1 \
          | tee "$OUT/workloadA_async_$mode.log" | grep -v "it/s\]" | tail -4
      done ;;
    int8mma)  # int8 q @ K^T on int8 tensor cores (cvt "mma_k" / "mma_k_words_v", not the defaults):
      # GPU int8 attention tests of those modes (vs the same-q-quantization reference and the
      # unquantized-q bound), greedy parity int8 vs float KV on the tiny families with the
      # default method and with "mma_k" forced (match rates, mean |logprob diff|), then decode
      # (b256/b32/b1, CUDA graphs) and prefill (fresh16/chunk4) timed next to the int8 defaults
      # and bf16 in the same call; "vs bf16" is the ratio column
      timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_attention_int8.py -k "mma" -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_int8mma_tests.log" | tail -6
      timeout 120 python3 -m pytest -q -s tests/parity/test_gpu_int8.py -k "kv_on_gpu or kv_mma" -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_int8mma_parity.log" | grep -E "positional|passed|failed" | tail -12
      timeout 150 python3 bench/int8_decode.py --block-n 128 --cvt mma_k mma_k_words_v --iters 30 \
        --out "$OUT/int8mma_decode.json" 2>&1 | tee "$OUT/int8mma_decode.log" | tail -16
      timeout 100 python3 bench/int8_prefill.py --cvt prmt_load mma_k mma_k_words_v words_k \
        --out "$OUT/int8mma_prefill.json" 2>&1 | tee "$OUT/int8mma_prefill.log" | tail -12 ;;
    int8round2)  # issue 14 round 2, one 10-minute call: the int8 decode variants around round 1's
      # winner (bench/int8_decode.py --round2: precompiled in parallel, each checked against the
      # reference, vs the bf16 kernel in CUDA graphs on b256/b32/b1; prints the winners, the split
      # rule and the DECODE_INT8 line), then int8 vs bf16 prefill per operand method. No pytest
      # (round 1 ran it; `tests` or the int8 pytest file covers the new cvt pairs on the GPU).
      timeout 420 python3 bench/int8_decode.py --round2 --budget-s ${INT8R2_BUDGET_S:-270} --iters 30 \
        --out "$OUT/int8_round2.json" 2>&1 | tee "$OUT/int8_round2.log" | tail -130
      timeout 150 python3 bench/int8_prefill.py --out "$OUT/int8_prefill.json" 2>&1 \
        | tee "$OUT/int8_prefill.log" | tail -12 ;;
    normfuse)  # issue 11: add + RMSNorm folded into the small-batch GEMV after it. GPU tests of gemv,
      # norm and the fused prologue (kernels and the tiny models with CUDA graphs), the per-step
      # kernel list with the fusion off (count line only) and on, then batch-1 TPOT off vs on
      # (A/B through INFER_CLUSTER_NORM_FUSE, small path on in both)
      timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_gemv.py tests/kernels/test_norm.py \
        tests/kernels/test_gemv_norm.py tests/parity/test_norm_fuse.py -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_normfuse_tests.log" | tail -6
      INFER_CLUSTER_NORM_FUSE=0 timeout 120 python3 bench/decode_kernels.py --steps 10 2>&1 | grep "per decode step"
      INFER_CLUSTER_NORM_FUSE=1 timeout 120 python3 bench/decode_kernels.py --steps 10 2>&1 | head -40
      for f in 0 1; do echo "--- INFER_CLUSTER_NORM_FUSE=$f"
        INFER_CLUSTER_NORM_FUSE=$f timeout 150 python3 bench/latency.py --model qwen3-0.6b-shape \
          --max-model-len 4096 --out "$OUT/tpot_qwen3_normfuse$f.json" 2>&1 | tail -8
      done ;;
    timeline)  # issue 11: one batch-1 decode step as the graph replays it: kernels in order, gaps between
      # (TIMELINE_FLAGS=--copies: the memcpys too; the sequence is also in the JSON)
      timeout 200 python3 bench/decode_timeline.py --steps 10 ${TIMELINE_FLAGS:-} --out "$OUT/decode_timeline.json" 2>&1 \
        | tail -${TIMELINE_LINES:-290} ;;
    pdl)  # issue 11: programmatic dependent launch for the small-batch GEMVs, first W tile loaded before
      # the wait (kernels/pdl.py). GPU tests of gemv / fused norm / decode attention, batch-1 TPOT with
      # INFER_CLUSTER_PDL=0 then 1, then the step timeline with PDL on
      timeout 300 python3 -m pytest -q -m gpu tests/kernels/test_gemv.py tests/kernels/test_gemv_norm.py \
        tests/kernels/test_attention.py tests/kernels/test_qkv_prep.py tests/parity/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_pdl_tests.log" | tail -4
      for p in 0 1; do echo "--- INFER_CLUSTER_PDL=$p"
        INFER_CLUSTER_PDL=$p timeout 150 python3 bench/latency.py --model qwen3-0.6b-shape --max-model-len 4096 \
          --out "$OUT/tpot_qwen3_pdl$p.json" 2>&1 | grep -E "tpot_ms_p|ttft_ms\""
      done
      timeout 200 python3 bench/decode_timeline.py --steps 10 --out "$OUT/decode_timeline_pdl.json" 2>&1 | head -${TIMELINE_LINES:-16} ;;
    allreduce)  # issue 11: symmetric-memory TP all-reduce (symm_allreduce.py). GPU sum test, the latency
      # table per path and size, workload A at T=2 with NCCL then symmetric memory (INFER_CLUSTER_TP_ALLREDUCE)
      # and T=1, both shapes; then the distributed GPU tests.
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 150 python3 -m pytest -q -m gpu tests/distributed/test_gpu_allreduce.py -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_allreduce_tests.log" | tail -4
      timeout 150 python3 bench/allreduce.py --out "$OUT/allreduce.json" 2>&1 | tail -20
      for run in "qwen3-0.6b-shape 2 nccl" "qwen3-0.6b-shape 2 ${AR_MODE:-auto}" "qwen3-0.6b-shape 1 nccl" \
                 "llama-3-8b-shape 2 nccl" "llama-3-8b-shape 2 ${AR_MODE:-auto}" "llama-3-8b-shape 1 nccl"; do
        read -r model tp ar <<< "$run"
        echo "--- $model T=$tp INFER_CLUSTER_TP_ALLREDUCE=$ar"
        INFER_CLUSTER_TP_ALLREDUCE=$ar timeout 110 python3 bench/throughput.py --model "$model" --load-format dummy \
          --dtype bfloat16 --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --tensor-parallel-size "$tp" --out "$OUT/ar_t${tp}_${ar}_$model.json" 2>&1 \
          | grep -E "^infer-cluster|^model=|Error|error|WARNING" | tail -4
      done
      timeout "${DIST_LIMIT:-240}" python3 -m pytest -q -m gpu tests/distributed -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_dist_tests_ar.log" | tail -6 ;;
    stagegraphs)  # issue 11: decode graphs per pipeline stage (the default; INFER_CLUSTER_STAGE_GRAPHS=0 is the eager A/B). GPU parity at P=2
      # (one step at a time and micro-batches), then workload A, Llama-3-8B shape: P=1, then P=2 micro-batches
      # off / on with stage graphs, and P=2 off without them (the eager baseline), same call.
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 200 python3 -m pytest -q -m gpu tests/distributed/test_gpu.py -k "stage_graphs or pp2" \
        -p no:cacheprovider 2>&1 | tee "$OUT/gpu_stage_graphs_tests.log" | tail -4
      for run in "1 off 0" "2 off 1" "2 on 1" "2 off 0"; do
        read -r pp mb sg <<< "$run"
        echo "--- llama-3-8b-shape P=$pp micro-batches $mb INFER_CLUSTER_STAGE_GRAPHS=$sg"
        INFER_CLUSTER_STAGE_GRAPHS=$sg timeout 110 python3 bench/throughput.py --model llama-3-8b-shape \
          --load-format dummy --dtype bfloat16 --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 \
          --max-model-len 4096 --hf none --pipeline-parallel-size "$pp" --pipeline-microbatches "$mb" \
          --out "$OUT/sg_p${pp}_${mb}_$sg.json" 2>&1 | grep -E "^infer-cluster|Error|error" | tail -3
      done ;;
    pipeline)  # issue 11, P=2 with stage graphs (the default since 2026-11-26): every GPU distributed test
      # (T=2 and P=2 parity with graphs, micro-batches with async scheduling, kill paths), then workload A,
      # Llama-3-8B shape: P=1, P=2 micro-batches on with async scheduling (auto) and off, P=2 one step at a time.
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout "${PIPE_TEST_LIMIT:-200}" python3 -m pytest -q -m gpu tests/distributed -p no:cacheprovider 2>&1 \
        | tee "$OUT/gpu_dist_tests.log" | tail -4
      for run in "1 off auto" "2 on auto" "2 on off" "2 off auto"; do
        read -r pp mb async <<< "$run"
        echo "--- llama-3-8b-shape P=$pp micro-batches $mb async scheduling $async"
        timeout 100 python3 bench/throughput.py --model llama-3-8b-shape \
          --load-format dummy --dtype bfloat16 --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 \
          --max-model-len 4096 --hf none --pipeline-parallel-size "$pp" --pipeline-microbatches "$mb" \
          --async-scheduling "$async" --out "$OUT/pipe_p${pp}_${mb}_$async.json" 2>&1 \
          | grep -E "^infer-cluster|Error|error" | tail -3
      done ;;
    backlog)  # steady serving with a backlog (docs/parallel.md, "Noticed"): 1,024 requests against max_num_seqs 256
      # keep every step a mix of one new prompt's prefill and a full decode batch, over graph_max_tokens (512), so
      # those steps run eagerly. Qwen3-0.6B shape, one GPU: the 256-request drain, then the backlog with the default,
      # with mixed-step graphs up to 2,048 tokens, and with the step's token budget capped at 512 (every step in a graph).
      for run in "256 512 8192" "1024 512 8192" "1024 2048 8192" "1024 512 512"; do
        read -r seqs gmt mbt <<< "$run"
        echo "--- $seqs seqs, graph_max_tokens $gmt, max_num_batched_tokens $mbt"
        timeout 150 python3 bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
          --num-seqs "$seqs" --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --graph-max-tokens "$gmt" --max-num-batched-tokens "$mbt" --out "$OUT/backlog_${seqs}_${gmt}_$mbt.json" 2>&1 \
          | grep -E "^infer-cluster|^phases|Error|error" | tail -3
      done ;;
    ncclsweep)  # issue 11, the 8B T=2 gap: a decode step's 2 MiB all-reduce takes ~30 us in NCCL inside graphs (~70 GB/s
      # on NVLink). NCCL's own knobs, no code of ours: the NCCL column of bench/allreduce.py (Llama hidden, decode rows)
      # under each setting, then workload A, Llama-3-8B shape, T=2 with the default and two settings, and T=1.
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      for env in "" "NCCL_PROTO=LL128" "NCCL_PROTO=LL" "NCCL_MIN_NCHANNELS=16" "NCCL_MIN_NCHANNELS=32 NCCL_PROTO=LL128"; do
        echo "--- all-reduce latency, ${env:-NCCL defaults}"
        env $env timeout 90 python3 bench/allreduce.py --hidden 4096 --rows 32 128 256 512 2>&1 | grep -E "^ *[0-9]|rows|Error" | tail -6
      done
      for env in "" "${NCCL_A:-NCCL_PROTO=LL128}" "${NCCL_B:-NCCL_MIN_NCHANNELS=16}"; do
        echo "--- llama-3-8b-shape T=2, ${env:-NCCL defaults}"
        env $env timeout 100 python3 bench/throughput.py --model llama-3-8b-shape --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --tensor-parallel-size 2 --out "$OUT/nccl_t2_$(echo "${env:-default}" | tr ' =' '__').json" 2>&1 \
          | grep -E "^infer-cluster|Error|error" | tail -2
      done
      echo "--- llama-3-8b-shape T=1"
      timeout 100 python3 bench/throughput.py --model llama-3-8b-shape --load-format dummy --dtype bfloat16 \
        --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
        --out "$OUT/nccl_t1.json" 2>&1 | grep -E "^infer-cluster|Error|error" | tail -2 ;;
    t2timeline)  # issue 11, the 8B T=2 gap: where rank 0's GPU time goes per step kind and batch size, and how
      # long it idles between steps (CUDA events, no profiler: bench/throughput.py --step-timeline), T=1 and T=2.
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      for tp in 1 2; do
        echo "--- llama-3-8b-shape T=$tp ${T2_EXTRA:-}"
        timeout 120 python3 bench/throughput.py --model llama-3-8b-shape --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --tensor-parallel-size $tp --step-timeline ${T2_EXTRA:-} --out "$OUT/t2tl_t$tp.json" 2>&1 \
          | grep -E "^infer-cluster|^--- step timeline|^phases|Error|error" | tail -4
      done ;;
    t2tail)  # issue 11: the tail at T=1 vs T=2 (TAIL_SEQS, 16), then each again with a torch.profiler trace of
      # rank 0 (kernels by family; bench/gpu_timeline.py).
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      for tp in 1 2; do
        tail_run llama-3-8b-shape $tp ${TAIL_SEQS:-16} "" t2tail_t$tp --step-timeline
        tail_run llama-3-8b-shape $tp ${TAIL_SEQS:-16} "" t2tail_t${tp}_prof --step-timeline --trace /tmp/t2tail
      done ;;
    t2gemv)  # issue 11: the T=2 tail with the small-batch linears off (cuBLAS) or the norm prologue off, T=1 with
      # them off; then the small-path sweep of one rank's T=2 shard shapes (bench/gemv.py --models ...-tp2).
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      for tp in 2 1; do for env in INFER_CLUSTER_GEMV=0 INFER_CLUSTER_NORM_FUSE=0; do
        tail_run llama-3-8b-shape $tp ${TAIL_SEQS:-16} "$env" "t2gemv_t${tp}_$(tag "$env")" --step-timeline
      done; done
      timeout 300 python3 bench/gemv.py --sweep --models ${GEMV_SWEEP_MODELS:-llama-3-8b-tp2} --budget-s ${GEMV_SWEEP_S:-150} \
        --out "$OUT/gemv_sweep_tp2.json" 2>&1 | grep -E "^    \(|not swept|s on" ;;
    t2verify)  # issue 11 after the T=2 shard table and the fused-norm limit: tail runs (T2V_TAILS, comma-separated
      # "model T seqs [ENV=VALUE]"; default the 8B tail at 16 rows, T=1 and T=2, and the norm prologue at 4 rows
      # on and off), the GEMV GPU tests when T2V_GEMV_TESTS is set, then workload A at T=1 and T=2 (T2V_MODELS).
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      IFS=, read -ra tails <<< "${T2V_TAILS:-llama-3-8b-shape 1 16,llama-3-8b-shape 2 16,llama-3-8b-shape 1 4,llama-3-8b-shape 1 4 INFER_CLUSTER_NORM_FUSE=0}"
      for run in "${tails[@]}"; do
        read -r model tp seqs env <<< "$run"
        tail_run "$model" "$tp" "$seqs" "${env:-}" "t2v_tail_${model%%-*}_t${tp}_$seqs${env:+_$(tag "$env")}"
      done
      [ -n "${T2V_GEMV_TESTS:-}" ] && timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_gemv.py tests/kernels/test_gemv_norm.py -p no:cacheprovider 2>&1 | tail -2
      for model in ${T2V_MODELS-llama-3-8b-shape qwen3-0.6b-shape}; do for tp in 1 2; do
        echo "--- $model workload A T=$tp"
        timeout 110 python3 bench/throughput.py --model $model --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --tensor-parallel-size $tp --out "$OUT/t2v_${model}_t$tp.json" 2>&1 | grep -E "^infer-cluster|Error|error" | tail -2
      done; done ;;
    ablation)  # issue 11, batch-1 TPOT: the step with one kernel of the chain left out (bench/tpot_ablation.py),
      # the most a fusion could gain; ABLATION_VARIANTS picks the runs
      python3 bench/tpot_ablation.py --variants "${ABLATION_VARIANTS:-base,prep,reduce,decode,attn,splitsum,o_nosplit,base}" \
        --model qwen3-0.6b-shape --max-model-len 4096 --out "$OUT/tpot_ablation.json" 2>&1 | grep -E "TPOT|failed|Error" ;;
    preload)  # issue 11, batch-1 TPOT: decode attention and the qkv prep load what no kernel of the step writes
      # before the PDL wait (INFER_CLUSTER_DECODE_PRELOAD=0 turns the decode tile off). Kernel, PTX-order and GPU
      # parity tests, then TPOT_RUNS (comma-separated env settings, "-" for none) alternating, then workload A
      # on the Qwen3 shape with the tile on and off
      timeout 300 python3 -m pytest -q -m gpu tests/kernels/test_attention.py tests/kernels/test_pdl.py \
        tests/kernels/test_qkv_prep.py tests/parity/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_preload_tests.log" | tail -4
      tpot_alternating "${TPOT_RUNS:--,INFER_CLUSTER_DECODE_PRELOAD=0,-,INFER_CLUSTER_DECODE_PRELOAD=0}" tpot_qwen3
      [ "${PRELOAD_WLA:-1}" = 1 ] && WLA_RUNS="qwen3-0.6b-shape 1 1,qwen3-0.6b-shape 1 1 INFER_CLUSTER_DECODE_PRELOAD=0" \
        OUT="$OUT" bash "$0" wla ;;
    onechunk)  # issue 11, batch-1 TPOT: the GEMV one-chunk build (default; INFER_CLUSTER_GEMV_ONE_CHUNK=0 is the
      # general build) compiles launches whose K slice is one chunk without the chunk loop (the 4 x 1024
      # fused-norm tile: 71 -> 40 registers, so gate_up's 1,536 programs fit one wave). GPU tests, TPOT off / on
      # alternating (ONECHUNK_RUNS), workload A off / on. Table rows for it: stage onechunk_rows
      timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_gemv.py \
        tests/kernels/test_gemv_norm.py tests/kernels/test_gemv_one_chunk.py tests/parity/test_gpu.py \
        tests/parity/test_norm_fuse.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_onechunk_tests.log" | tail -4
      tpot_alternating "${ONECHUNK_RUNS:-INFER_CLUSTER_GEMV_ONE_CHUNK=0,-,INFER_CLUSTER_GEMV_ONE_CHUNK=0,-}" tpot_onechunk
      WLA_RUNS="qwen3-0.6b-shape 1 1 INFER_CLUSTER_GEMV_ONE_CHUNK=0,qwen3-0.6b-shape 1 1" OUT="$OUT" bash "$0" wla ;;
    onechunk_rows)  # the batch-1 table rows the one-chunk build may want (tpot_ablation, one process each): down
      # as one 4 x 4096 chunk; gate_up and qkv at 8 x 1024 w4 (64 registers: one wave with the o projection's
      # programs still resident); ONECHUNK_VARIANTS picks others. H100, 2026-11-28: none beat the table
      python3 bench/tpot_ablation.py --variants "${ONECHUNK_VARIANTS:-base,gemv=1024.3072.1:4.4096.8.1.1,gemv=6144.1024.1:8.1024.4.1.1,gemv=4096.1024.1:8.1024.4.1.1,base}" \
        --model qwen3-0.6b-shape --max-model-len 4096 --out "$OUT/tpot_onechunk_rows.json" 2>&1 | grep -E "TPOT|failed|Error" ;;
    symmfail)  # issue 11: the failure path of the symmetric-memory all-reduce (`auto`, the default since 2026-11-28):
      # a killed rank with it really set up (each case in a fresh interpreter), then the 8B T=2 auto / T=1 / NCCL A/B
      # (SYMM_RUNS)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 420 python3 -m pytest -q -m gpu tests/distributed/test_gpu_symm_failure.py -p no:cacheprovider 2>&1 \
        | tee "$OUT/symm_failure_tests.log" | tail -4
      WLA_RUNS="${SYMM_RUNS:-llama-3-8b-shape 2 1 INFER_CLUSTER_TP_ALLREDUCE=auto,llama-3-8b-shape 1 1,llama-3-8b-shape 2 1 INFER_CLUSTER_TP_ALLREDUCE=nccl}" \
        OUT="$OUT" bash "$0" wla ;;
    stepinputs)  # issue 11, batch-1 TPOT: a steady decode step's inputs without device launches (int32 metadata
      # packed in the upload, the draw read as the input ids; 2aaf620). prepare_cost on the GPU, then TPOT alternating
      # between this tree and OLD_TREE (the commit before as plain files, e.g. `mkdir old-tree && git archive
      # d42a6c9 | tar -x -C old-tree` here: an untracked folder travels with the tree, a nested git checkout
      # would not), then the step timeline
      timeout 120 python3 bench/prepare_cost.py --device cuda --out "$OUT/prepare_cost.json" 2>&1 | tail -4
      for i in 1 2; do
        for tree in "$PWD" ${OLD_TREE:+"$(cd "$OLD_TREE" && pwd)"}; do
          echo "--- $i: TPOT $tree"
          tpot_in_tree "$tree" "$OUT/tpot_stepinputs_${i}_$(basename "$tree").json"
        done
      done
      TIMELINE_LINES=12 OUT="$OUT" bash "$0" timeline ;;
    greedygraph)  # issue 11, batch-1 TPOT: the split argmax captured in the T=1 decode graph
      # (INFER_CLUSTER_GREEDY_GRAPH_MAX, 0: off) on top of the step-input changes. GPU tests, then TPOT alternating
      # OLD_TREE (the tree before the step-input changes, as plain files; see stepinputs) / off / on, twice,
      # then the step timeline with it on
      timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_argmax.py tests/parity/test_gpu.py \
        -k "argmax or greedy_graphs or tiny_float32" -p no:cacheprovider 2>&1 | tee "$OUT/greedygraph_tests.log" | tail -3
      for i in 1 2; do
        if [ -n "${OLD_TREE:-}" ]; then
          echo "--- $i: TPOT $OLD_TREE"; tpot_in_tree "$OLD_TREE" "$OUT/tpot_greedygraph_${i}_old.json"
        fi
        for g in 0 32; do echo "--- $i: TPOT INFER_CLUSTER_GREEDY_GRAPH_MAX=$g"
          tpot_in_tree . "$OUT/tpot_greedygraph_${i}_$g.json" INFER_CLUSTER_GREEDY_GRAPH_MAX=$g
        done
      done
      TIMELINE_LINES=12 OUT="$OUT" bash "$0" timeline ;;
    greedyids)  # issue 11: greedy steps at T > 1 gather argmax pairs, not logits (INFER_CLUSTER_TP_GREEDY_IDS=0:
      # the logits gathered inside the forward, as before). The GPU distributed tests, then GREEDY_RUNS workload A
      # runs alternating (default: the 8B shape T=1, then T=2 on / off twice)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 240 python3 -m pytest -q -m gpu tests/distributed -p no:cacheprovider 2>&1 | tee "$OUT/dist_tests.log" | tail -3
      WLA_RUNS="${GREEDY_RUNS:-llama-3-8b-shape 1 1,llama-3-8b-shape 2 1,llama-3-8b-shape 2 1 INFER_CLUSTER_TP_GREEDY_IDS=0,llama-3-8b-shape 2 1,llama-3-8b-shape 2 1 INFER_CLUSTER_TP_GREEDY_IDS=0}" \
        OUT="$OUT" bash "$0" wla ;;
    wla)  # workload A runs from WLA_RUNS (comma-separated "model T P [ENV=VALUE ...] [--flag ...]") in that order,
      # so A/B runs alternate inside one call; default: the 8B shape at T=1 and T=2
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      IFS=, read -ra runs <<< "${WLA_RUNS:-llama-3-8b-shape 1 1,llama-3-8b-shape 2 1}"
      i=0
      for run in "${runs[@]}"; do
        read -r model tp pp rest <<< "$run"; i=$((i + 1))
        env_words=(); flags=()
        # NAME=VALUE before the first --flag is the environment; the rest are flags and their values
        for w in $rest; do case "${#flags[@]}:$w" in 0:*=*) env_words+=("$w") ;; *) flags+=("$w") ;; esac; done
        env=${env_words[*]:-}
        echo "--- $i: $model workload A T=$tp P=$pp ${rest:-}"
        env ${env} timeout "${WLA_TIMEOUT:-150}" python3 bench/throughput.py --model "$model" --load-format dummy --dtype bfloat16 \
          --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --hf none \
          --tensor-parallel-size "$tp" --pipeline-parallel-size "$pp" "${flags[@]}" \
          --out "$OUT/wla_${i}_${model%%-*}_t${tp}_p$pp${env:+_$(tag "$env")}.json" 2>&1 \
          | grep -E "^infer-cluster|^--- step timeline|Error|error|^env:|^usage|No such" | tail -6
      done ;;
    kinds_tp)  # issue 11 with the request kinds users send: workload A as greedy / sampled / penalties / logprobs
      # (one engine per run) at T=1 and T=2, both shapes, after the GPU distributed tests
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout 240 python3 -m pytest -q -m gpu tests/distributed tests/parity/test_norm_fuse.py -p no:cacheprovider 2>&1 | tail -3
      WLA_TIMEOUT=200 WLA_RUNS="llama-3-8b-shape 1 1 --sampling all,llama-3-8b-shape 2 1 --sampling all,qwen3-0.6b-shape 1 1 --sampling all,qwen3-0.6b-shape 2 1 --sampling all" \
        OUT="$OUT" bash "$0" wla ;;
    sampler_kernels)  # the sampler's kernels (kernels/sample_triton.py, penalty_triton.py): their GPU tests and
      # the draw's no-sync and async checks, the sampler alone with them off / on (cProfile of the host side
      # when on), then workload A on the Qwen3 shape per request kind at T=1 and T=2 (on), with the A/B of
      # the switch (INFER_CLUSTER_SAMPLER_KERNELS=0) in the same call, and top_p alone at T=1 and T=2
      # (SK_RUNS overrides the runs)
      timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_sample_draw.py tests/kernels/test_penalty_kernels.py \
        tests/kernels/test_random_stream.py tests/unit/test_sampling_ops.py tests/unit/test_sampler.py \
        tests/unit/test_sampling_state.py -p no:cacheprovider 2>&1 | tail -3
      timeout 240 python3 -m pytest -q tests/parity/test_gpu.py -k "sync_debug or unresolved or async" \
        -p no:cacheprovider 2>&1 | tail -3
      for sw in 0 1; do
        flags=(); [ "$sw" = 1 ] && flags=(--cprofile)
        INFER_CLUSTER_SAMPLER_KERNELS=$sw timeout 150 python3 bench/sampler_profile.py "${flags[@]}" \
          --out "$OUT/sampler_profile_kernels$sw.json" > "$OUT/sampler_profile_kernels$sw.log" 2>&1
        grep "ms per call" "$OUT/sampler_profile_kernels$sw.log"
      done
      WLA_TIMEOUT=200 WLA_RUNS="${SK_RUNS:-qwen3-0.6b-shape 1 1 --sampling all,qwen3-0.6b-shape 2 1 --sampling all,\
qwen3-0.6b-shape 1 1 INFER_CLUSTER_SAMPLER_KERNELS=0 --sampling penalties,qwen3-0.6b-shape 2 1 INFER_CLUSTER_SAMPLER_KERNELS=0 --sampling penalties,\
qwen3-0.6b-shape 1 1 --sampling top_p,qwen3-0.6b-shape 2 1 --sampling top_p}" \
        OUT="$OUT" bash "$0" wla ;;
    topp_cut)  # the top-p cut's 16-way search (66cbf17) against the tree in AB_OLD (a checkout of the commit
      # before, with the 33-pass bisection kernel, carried beside this tree): the draw's GPU tests, the sampler
      # alone in both trees, then workload A (Qwen3 shape, T=1) top_p alone alternating new / old, greedy once
      timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_sample_draw.py -p no:cacheprovider 2>&1 | tail -2
      site=${PYTHONPATH%%:*}
      for tree in "$PWD" "${AB_OLD:?AB_OLD: the old tree}"; do
        tag=$([ "$tree" = "$PWD" ] && echo new || echo old)
        (cd "$tree" && PYTHONPATH="$site:$tree" timeout 150 python3 bench/sampler_profile.py \
          --out "$OUT/sampler_profile_$tag.json" > "$OUT/sampler_profile_$tag.log" 2>&1)
        echo "$tag: $(grep "ms per call" "$OUT/sampler_profile_$tag.log" | tr '\n' ' ')"
      done
      for tree in "$PWD" "$AB_OLD" "$PWD" "$AB_OLD" greedy; do
        tag=$([ "$tree" = "$AB_OLD" ] && echo old || echo new); kind=top_p
        [ "$tree" = greedy ] && { tree=$PWD; kind=greedy; }
        echo "--- $tag workload A T=1 --sampling $kind"
        (cd "$tree" && PYTHONPATH="$site:$tree" timeout 150 python3 bench/throughput.py --model qwen3-0.6b-shape \
          --load-format dummy --dtype bfloat16 --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 \
          --max-model-len 4096 --hf none --sampling $kind --out "$OUT/topp_cut_${tag}_$kind.json" 2>&1 \
          | grep -E "^infer-cluster|Error|error" | tail -3)
      done ;;
    topp_profile)  # where a top_p-alone draw's GPU time goes: torch.profiler's kernel table for it and for sampled
      timeout 150 python3 bench/sampler_profile.py --kinds top_p_only,sampled --profile \
        --out "$OUT/sampler_profile_kernels.json" 2>&1 | tee "$OUT/sampler_profile_kernels.log" | grep -v "^-\+ *$" | head -60 ;;
    ab_wla)  # workload A A/B between this tree ("new") and AB_OLD ("old", a checkout carried beside it), alternating
      # in one call: AB_RUNS is comma-separated "new|old model T kind"
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      site=${PYTHONPATH%%:*}
      IFS=, read -ra runs <<< "${AB_RUNS:?AB_RUNS: new|old model T kind, ...}"
      for run in "${runs[@]}"; do
        read -r which model tp kind <<< "$run"
        tree=$PWD; [ "$which" = old ] && tree=${AB_OLD:?AB_OLD: the old tree}
        echo "--- $which $model workload A T=$tp --sampling $kind"
        (cd "$tree" && PYTHONPATH="$site:$tree" timeout "${WLA_TIMEOUT:-150}" python3 bench/throughput.py --model "$model" \
          --load-format dummy --dtype bfloat16 --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 \
          --max-model-len 4096 --hf none --tensor-parallel-size "$tp" --sampling "$kind" \
          --out "$OUT/ab_${which}_${model%%-*}_t${tp}_$kind.json" 2>&1 | grep -E "^infer-cluster|Error|error" | tail -3)
      done ;;
    persistent)  # issue 11, batch-1 TPOT: the four GEMVs of each layer as one persistent kernel
      # (bench/persistent_chain.py; bench/persistent_gluon.py stages weights in shared memory)
      # against the tuned per-GEMV launches, per layer; PC_RUNS lists "PROGRAMS WARPS" pairs,
      # comma-separated ("-": the Triton form not at all)
      IFS=, read -ra pcs <<< "${PC_RUNS:-128 16,128 8,256 8}"
      for pc in "${pcs[@]}"; do [ "$pc" = - ] && continue; read -r g w <<< "$pc"; echo "--- persistent programs=$g warps=$w"
        timeout 120 python3 bench/persistent_chain.py --programs "$g" --warps "$w" 2>&1 \
          | tee "$OUT/persistent_${g}_$w.json" | tail -3
      done
      echo "--- persistent, Gluon, weights staged in shared memory"
      timeout 90 python3 bench/persistent_gluon.py 2>&1 | tee "$OUT/persistent_gluon.json" | tail -3 ;;
    fusedmlp)  # issue 11, batch-1 TPOT: each layer's MLP as one launch (kernels/mlp_triton.py)
      # against the two GEMVs, per layer (FM_CONFIGS: channels-per-program x warps, comma-separated;
      # "-" skips it), then batch-1 TPOT for each FM_RUNS entry (INFER_CLUSTER_FUSED_MLP), in order
      if [ "${FM_CONFIGS:-}" != - ]; then
        timeout 200 python3 bench/fused_mlp.py --configs "${FM_CONFIGS:-16x8,32x8,16x16}" 2>&1 \
          | tee "$OUT/fused_mlp.json" | tail -3
      fi
      IFS=, read -ra fms <<< "${FM_RUNS:-0,1,0,1}"
      i=0; for a in "${fms[@]}"; do i=$((i + 1)); echo "--- TPOT INFER_CLUSTER_FUSED_MLP=$a"
        INFER_CLUSTER_FUSED_MLP=$a timeout 150 python3 bench/latency.py --model qwen3-0.6b-shape \
          --max-model-len 4096 2>&1 | tee "$OUT/fused_tpot_${i}_$a.log" | grep tpot_ms_p50
      done ;;
    tpot_kinds)  # batch-1 TPOT by request kind (bench/latency.py --sampling all, then top_p alone), one
      # engine per entry of TK_RUNS (env settings, comma-separated, "-" for none), in that order
      IFS=, read -ra tks <<< "${TK_RUNS:--}"
      i=0; for e in "${tks[@]}"; do i=$((i + 1)); [ "$e" = - ] && e=""
        for kind in all top_p; do echo "--- TPOT $kind ${e:-defaults}"
          env $e timeout 150 python3 bench/latency.py --model qwen3-0.6b-shape \
            --max-model-len 4096 --sampling $kind --out "$OUT/tpot_kinds_${i}_$kind.json" 2>&1 \
            | grep -E '"sampling"|tpot_ms_p50|Error'
        done
      done ;;
    tpot_where)  # where a batch-1 step's time goes by request kind (TW_KINDS, comma-separated): host
      # phases against the graph alone (step_profile.py), the GPU timeline of a step (decode_timeline.py),
      # and the sampler alone at one row under cProfile (sampler_profile.py)
      IFS=, read -ra tw <<< "${TW_KINDS:-greedy,sampled,penalties,top_p}"
      for kind in "${tw[@]}"; do echo "--- $kind"
        timeout 150 python3 bench/step_profile.py --sampling $kind --out "$OUT/step_profile_$kind.json" 2>&1 | tail -2
        timeout 150 python3 bench/decode_timeline.py --sampling $kind --steps 10 \
          --out "$OUT/decode_timeline_$kind.json" > "$OUT/decode_timeline_$kind.log" 2>&1
        grep -A 16 "decode steps (median)" "$OUT/decode_timeline_$kind.log"
      done
      timeout 150 python3 bench/sampler_profile.py --rows 1 --cprofile --profile --kinds greedy,sampled,penalties,top_p_only \
        --out "$OUT/sampler_profile_1row.json" > "$OUT/sampler_profile_1row.log" 2>&1; grep "ms per call" "$OUT/sampler_profile_1row.log" ;;
    coldstart_empty)  # start-up and first / warm runs with an empty Triton cache (a fresh
      # TRITON_CACHE_DIR), workload A, byte-level tokenizer; --log-compiles lists what a run compiled
      TRITON_CACHE_DIR=$(mktemp -d) timeout 400 python3 bench/cold_start.py --model qwen3-0.6b-shape \
        --load-format dummy --dtype bfloat16 --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 \
        --max-model-len 4096 --tokenizer bytelevel --log-compiles --out "$OUT/coldstart_empty.json" 2>&1 \
        | grep -v "it/s\]" | tail -14 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
