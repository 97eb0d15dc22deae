#!/usr/bin/env bash
# GPU benchmarks and GPU tests, grouped into suites by purpose (bench/README.md lists them).
#
#   bash bench/gpu_suite.sh SUITE|STAGE...
#
# Each suite other than `full` ends inside 570 s (the lent GPU machine runs one command for at
# most 10 minutes): a stage that would start with less than its minimum left is skipped and
# listed as such; rerun it by name in another call. `full` runs every suite in turn with no
# limit, so on the lent machine it takes one call per suite. Logs and JSON go to
# ${OUT:-bench/results}; a summary (stage, seconds, status) ends every run, and the exit status
# is 1 when a stage failed or was skipped.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: bash bench/gpu_suite.sh SUITE|STAGE...

suites (each ends inside 570 s, except full):
  smoke       1 GPU   versions, rooflines, GPU parity tests, batch-1 TPOT, workload A    ~4 min
  tests       1-2     every GPU test: kernels, parity, engine, distributed (2 GPUs)
  kernels     1 GPU   kernel microbenchmarks against their references in the same run
  throughput  1 GPU   workload A: vs HF, by request kind, 8B shape, int8 KV, async; host tier
  latency     1 GPU   batch-1 TPOT by request kind and where it goes; cold start
  apps        1 GPU   prompt TTFT through the graphs, speculative decoding (SmolLM2), structured outputs
  parallel    2 GPUs  workload A at T=1 / T=2 / P=2 by request kind, serve -dp 2, all-reduce
  full        all     every suite above in turn (no time limit: one call per suite)

stages outside the suites (run by name; environment variables set their runs):
  targets            issue 44's figures: per seed a roofline then workload A, bf16 and int8;
                     the batch-256 decode grid; bench/targets.py's table     TARGET_SEEDS="0 1 2"
  tpot_ab            batch-1 TPOT alternating between env settings   TPOT_RUNS="A=0,-,A=0,-"
  workload_a_runs    workload A runs in order                        WLA_RUNS="model T P [ENV=V] [--flag v],..."
  workload_a_trees   workload A alternating this tree and AB_OLD     AB_OLD=dir AB_RUNS="new|old model T kind,..."
  tpot_trees         batch-1 TPOT alternating this tree and OLD_TREE OLD_TREE=dir
  gemv_sweep         small-batch GEMV launch sweep (kernels/gemv_tuned.py entries)  GEMV_SWEEP_ARGS
  int8_variants      int8 decode attention variants vs bf16 (the DECODE_INT8 line)
  int8_round2        int8 decode variants around the current winner
  decode_tune        float decode attention launch sweep (bench/tune_decode.py)
  tpot_ablation      batch-1 TPOT with one kernel left out           ABLATION_VARIANTS
  decode_timeline    one batch-1 decode step's kernels and gaps      TIMELINE_FLAGS
  decode_kernels     kernels of one batch-1 decode step, eager
  step_kernels       a workload-A decode step's GPU time by kernel family, bf16 and int8 KV
  decode_persistent  bf16 decode attention: persistent kernel rules vs the Triton kernel   DP_BATCHES
  decode_ncu         decode attention under ncu's counters, bf16 and int8 KV   NCU_CELL="--batch 256 --context 1024"
  gemm_ncu           a layer's four mid-size GEMMs under ncu's counters (L2 against DRAM)   GEMM_NCU_M=256
  sampler            the sampler alone per request kind (ms per call, profiler table)
  mixed_step         host launch vs GPU time per step kind
  prepare_cost       a decode step's input preparation on the GPU
  workload_a_trace   workload A profiled whole, bf16 and int8 KV (compute idle, gaps)
  host_tier_trace    the host-tier workload profiled, tier off and on
  backlog            1,024 requests against 256 slots: mixed steps, graph sizes
  tp_tail            the long-sequence tail at T=1 and T=2 with step timelines (2 GPUs)
  tp_step_timeline   GPU time per step kind and idle time, 8B shape T=1 and T=2 (2 GPUs)
  gateway            the HTTP gateway against ZMQ, CPU then GPU (needs the gateway packages)
Every suite's stages can be run by name too: see the SUITES table in this file.
EOF
}

OUT=${OUT:-bench/results}
PY=${PYTHON:-python3}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30
# NVLink multicast stays off in NCCL, torch and NVSHMEM (it can take a shared host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

declare -A SUITES=(
  [smoke]="env roofline parity_quick tpot workload_a"
  [tests]="kernel_tests parity_tests engine_tests distributed_tests"
  [kernels]="kernel_micro gemv gemm qkv_prep fused_mlp int8_attention verify_attention row_stats kv_swap"
  [throughput]="workload_a_hf workload_a_kinds workload_a_llama8b kv_int8 async_sched host_tier"
  [latency]="tpot_kinds tpot_breakdown cold_start cold_start_empty"
  [parallel]="layouts_qwen3 layouts_llama8b dp_scaling allreduce"
  [apps]="ttft_ladder spec_decode spec_decode_schema structured structured_sampled"
)
SUITE_ORDER="smoke tests kernels throughput latency apps parallel"
# Seconds a stage needs at least; one that would start with less left is skipped.
declare -A MIN_S=(
  [env]=5 [workload_a_hf]=240 [layouts_llama8b]=200 [layouts_qwen3]=120 [dp_scaling]=150
  [cold_start_empty]=120 [tpot_breakdown]=150 [kernel_tests]=120 [distributed_tests]=120
  [spec_decode]=150 [spec_decode_schema]=150 [structured]=150 [structured_sampled]=150
  [targets]=300
)
DEFAULT_MIN_S=60

# Workload A: 256 requests, prompts and outputs U[100, 1024], ignore_eos, dummy bf16 weights.
WLA=(--load-format dummy --dtype bfloat16 --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024
     --max-model-len 4096 --hf none)
WLA_LINES="^infer-cluster|^model=|Error|error|^usage|No such"

# Seconds for a command that wants N: N, or what is left of the budget if less (at least 1).
lim() {
  local left=$((DEADLINE - SECONDS))
  ((left < 1)) && left=1
  echo $(($1 < left ? $1 : left))
}
gpus() { "$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0; }
need_gpus() {
  local n; n=$(gpus)
  if ((n < $1)); then echo "needs $1 GPUs, found $n"; return 3; fi
}
tag() { echo "$1" | tr -c 'A-Za-z0-9\n' '_'; }  # an env assignment as a file-name part
# One workload-A run of bench/throughput.py. wla_run MODEL T P NAME LIMIT [ENV=VALUE ...] [-- flags]
wla_run() {
  local model=$1 tp=$2 pp=$3 name=$4 limit=$5; shift 5
  local envs=()
  while (($#)) && [ "$1" != -- ]; do envs+=("$1"); shift; done
  (($#)) && shift
  echo "--- $model workload A T=$tp P=$pp ${envs[*]:-} $*"
  env ${envs[@]+"${envs[@]}"} timeout "$(lim "$limit")" "$PY" bench/throughput.py --model "$model" "${WLA[@]}" \
    --tensor-parallel-size "$tp" --pipeline-parallel-size "$pp" "$@" --out "$OUT/$name.json" 2>&1 \
    | tee "$OUT/$name.log" | grep -E "$WLA_LINES" | tail -8
}
# Batch-1 TPOT (bench/latency.py, Qwen3-0.6B shape). tpot_run NAME [ENV=VALUE ...] [-- flags]
tpot_run() {
  local name=$1; shift
  local envs=()
  while (($#)) && [ "$1" != -- ]; do envs+=("$1"); shift; done
  (($#)) && shift
  env ${envs[@]+"${envs[@]}"} timeout "$(lim 150)" "$PY" bench/latency.py --model qwen3-0.6b-shape \
    --max-model-len 4096 "$@" --out "$OUT/$name.json" 2>&1 | grep -E '"sampling"|tpot_ms_p|ttft_ms"|Error'
}
# Batch-1 TPOT p50 of the engine in TREE (this checkout, or another one as plain files).
# tpot_in_tree TREE OUT_JSON [ENV=VALUE ...]
tpot_in_tree() {
  local tree out site=${PYTHONPATH:-}; site=${site%%:*}; tree=$(cd "$1" && pwd); out=$(realpath -m "$2"); shift 2
  (cd "$tree" && env PYTHONPATH="${site:+$site:}$tree" "$@" timeout "$(lim 150)" "$PY" bench/latency.py \
    --model qwen3-0.6b-shape --max-model-len 4096 --out "$out" 2>&1 | grep -E "tpot_ms_p50")
}
# The long-sequence tail alone: SEQS requests (prompts U[1500, 1800], 300 tokens each), decode-only
# after their prefill. tail_run MODEL T SEQS "ENV=VALUE ..." NAME [bench/throughput.py flags]
tail_run() {
  local model=$1 tp=$2 seqs=$3 envs=$4 name=$5; shift 5
  echo "--- $model tail T=$tp, $seqs seqs ${envs} $*"
  env $envs timeout "$(lim 120)" "$PY" bench/throughput.py --model "$model" --load-format dummy --dtype bfloat16 \
    --num-seqs "$seqs" --prompt-len 1500 1800 --output-len 300 300 --max-model-len 4096 --hf none \
    --tensor-parallel-size "$tp" --out "$OUT/$name.json" "$@" 2>&1 \
    | grep -E "^infer-cluster|^--- step|^window|compute kernels|^  kernel|Error|error" | sed -n 1,24p
}
gpu_pytest() {  # gpu_pytest LIMIT LOG PATHS_AND_FLAGS...
  local limit=$1 log=$2; shift 2
  timeout "$(lim "$limit")" "$PY" -m pytest -q -m gpu -p no:cacheprovider "$@" 2>&1 | tee "$OUT/$log" | tail -6
}

# ---- smoke -------------------------------------------------------------------------------------
stage_env() {
  "$PY" -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())" \
    && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
}
stage_roofline() {  # measured copy bandwidth and matmul rate; workload A's ceiling per shape
  local st=0 m
  for m in qwen3-0.6b-shape llama-3-8b-shape; do
    timeout "$(lim 90)" "$PY" bench/roofline.py --model $m --out "$OUT/roofline_${m%-shape}.json" || st=1
  done
  timeout "$(lim 90)" "$PY" bench/roofline.py --kv-cache-dtype int8 --out "$OUT/roofline_qwen3-0.6b_int8.json" || st=1
  return $st
}
stage_parity_quick() { gpu_pytest 240 gpu_parity_quick.log tests/parity/test_gpu.py; }
stage_tpot() { tpot_run tpot_qwen3; }
stage_workload_a() { wla_run qwen3-0.6b-shape 1 1 workload_a_qwen3_t1 150; }

# ---- tests -------------------------------------------------------------------------------------
stage_kernel_tests() { gpu_pytest 300 gpu_kernel_tests.log tests/kernels; }
stage_parity_tests() { gpu_pytest 300 gpu_parity_tests.log tests/parity; }
stage_engine_tests() {
  gpu_pytest 240 gpu_engine_tests.log tests/engine tests/unit/test_sampler.py tests/unit/test_sampling_ops.py
}
stage_distributed_tests() { need_gpus 2 || return; gpu_pytest 420 gpu_distributed_tests.log tests/distributed; }

# ---- kernels -----------------------------------------------------------------------------------
stage_kernel_micro() {  # every Triton kernel vs its torch reference, then the int8 KV rows
  local st=0
  timeout "$(lim 120)" "$PY" bench/kernels.py --out "$OUT/kernels.json" 2>&1 | tail -30 || st=1
  timeout "$(lim 90)" "$PY" bench/kernels.py --int8 --only int8 --out "$OUT/kernels_int8.json" 2>&1 | tail -12 || st=1
  return $st
}
stage_gemv() {  # small-batch GEMV vs cuBLAS, per linear and per decode step (GEMV_TUNED: a sweep's JSON)
  timeout "$(lim 150)" "$PY" bench/gemv.py ${GEMV_TUNED:+--tuned "$GEMV_TUNED"} --out "$OUT/gemv.json" 2>&1 \
    | tee "$OUT/gemv.log" | tail -16
}
stage_gemm() {  # mid-size GEMMs: a layer's four projections, cuBLAS against kernels/gemm_table.py (GEMM_ARGS)
  timeout "$(lim 90)" "$PY" bench/gemm.py ${GEMM_ARGS:-} --out "$OUT/gemm.json" 2>&1 | tail -10
}
stage_qkv_prep() { timeout "$(lim 120)" "$PY" bench/qkv_prep.py --out "$OUT/qkv_prep.json" 2>&1 | tail -12; }
stage_fused_mlp() {  # per layer: four GEMV launches vs qkv + o + the fused MLP (FM_CONFIGS: launches)
  timeout "$(lim 200)" "$PY" bench/fused_mlp.py --configs "${FM_CONFIGS:-16x8,32x8,16x16}" \
    --out "$OUT/fused_mlp.json" 2>&1 | tail -3
}
stage_int8_attention() {  # decode and prefill attention over an int8 KV cache vs bf16
  local st=0
  timeout "$(lim 150)" "$PY" bench/int8_decode.py --out "$OUT/int8_decode.json" 2>&1 | tail -12 || st=1
  timeout "$(lim 150)" "$PY" bench/int8_prefill.py --out "$OUT/int8_prefill.json" 2>&1 | tail -12 || st=1
  return $st
}
stage_verify_attention() {  # a verify step's decode rows: runs (one KV read a chunk of rows) vs row by row
  timeout "$(lim 90)" "$PY" bench/verify_attention.py --variants g16 g16:pps2 g16:rows --out "$OUT/verify_attention.json" 2>&1 | tail -9
}
stage_row_stats() { timeout "$(lim 90)" "$PY" bench/row_stats.py --out "$OUT/row_stats.json" 2>&1 | tail -16; }
stage_kv_swap() {  # host KV tier copies, GB/s per copy path
  timeout "$(lim 150)" "$PY" bench/kv_swap.py --out "$OUT/kv_swap.json" 2>&1 | tee "$OUT/kv_swap.log" | tail -32
}

# ---- throughput --------------------------------------------------------------------------------
stage_workload_a_hf() {  # workload A vs HF transformers' continuous batching (HF_SEQS prompts)
  timeout "$(lim 420)" "$PY" bench/throughput.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
    --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 \
    --hf "${HF_MODE:-continuous}" --hf-max-seqs "${HF_SEQS:-64}" --out "$OUT/workload_a_hf.json" 2>&1 \
    | tee "$OUT/workload_a_hf.log" | grep -v "it/s\]" | tail -12
}
stage_workload_a_kinds() {  # greedy / sampled / penalties / logprobs on one engine, best of two
  wla_run qwen3-0.6b-shape 1 1 workload_a_kinds_qwen3 200 -- --sampling all --repeats 2
}
stage_workload_a_llama8b() { wla_run llama-3-8b-shape 1 1 workload_a_llama8b_t1 150; }
stage_kv_int8() {  # KV cache bf16 then int8, one engine each
  local st=0 kv
  for kv in auto int8; do wla_run qwen3-0.6b-shape 1 1 workload_a_kv_$kv 120 -- --kv-cache-dtype $kv || st=1; done
  return $st
}
stage_async_sched() {  # async scheduling off then on
  local st=0 mode
  for mode in off on; do
    wla_run qwen3-0.6b-shape 1 1 workload_a_async_$mode 120 -- --async-scheduling $mode || st=1
  done
  return $st
}
stage_host_tier() {  # 256 requests over 16 distinct 4,000-token prefixes, device pool for 4: tier off vs on
  timeout "$(lim 200)" "$PY" bench/host_tier.py ${HOST_TIER_COPY_MODES:+--copy-modes "$HOST_TIER_COPY_MODES"} \
    --out "$OUT/host_tier.json" 2>&1 \
    | tee "$OUT/host_tier.log" | grep -v "it/s\]" | tail -8
}

# ---- latency -----------------------------------------------------------------------------------
stage_tpot_kinds() {  # batch-1 TPOT per request kind on one engine, then top_p alone
  local st=0 kind
  for kind in all top_p; do echo "--- TPOT $kind"; tpot_run tpot_kinds_$kind -- --sampling $kind || st=1; done
  return $st
}
stage_tpot_breakdown() {  # host phases vs the graph, the step's GPU timeline, the sampler alone (TW_KINDS)
  local st=0 kind kinds
  IFS=, read -ra kinds <<< "${TW_KINDS:-greedy,sampled}"
  for kind in "${kinds[@]}"; do echo "--- $kind"
    timeout "$(lim 150)" "$PY" bench/step_profile.py --sampling "$kind" --out "$OUT/step_profile_$kind.json" 2>&1 \
      | tail -2 || st=1
    timeout "$(lim 150)" "$PY" bench/decode_timeline.py --sampling "$kind" --steps 10 \
      --out "$OUT/decode_timeline_$kind.json" > "$OUT/decode_timeline_$kind.log" 2>&1 || st=1
    grep -A 16 "decode steps (median)" "$OUT/decode_timeline_$kind.log"
  done
  timeout "$(lim 150)" "$PY" bench/sampler_profile.py --rows 1 --kinds "${TW_KINDS:-greedy,sampled}" \
    --out "$OUT/sampler_profile_1row.json" > "$OUT/sampler_profile_1row.log" 2>&1 || st=1
  grep "ms per call" "$OUT/sampler_profile_1row.log"
  return $st
}
stage_cold_start() {  # start-up, first run vs warm runs; byte-level vs SentencePiece-style tokenizer
  local st=0 tok
  for tok in bytelevel metaspace; do
    timeout "$(lim 200)" "$PY" bench/cold_start.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
      --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 --tokenizer $tok \
      --out "$OUT/cold_start_$tok.json" 2>&1 | grep -v "it/s\]" | tail -7 || st=1
  done
  return $st
}
stage_cold_start_empty() {  # the same with an empty Triton cache; --log-compiles lists what a run compiled
  local cache; cache=$(mktemp -d)
  TRITON_CACHE_DIR=$cache timeout "$(lim 400)" "$PY" bench/cold_start.py --model qwen3-0.6b-shape \
    --load-format dummy --dtype bfloat16 --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 \
    --max-model-len 4096 --tokenizer bytelevel --log-compiles --out "$OUT/cold_start_empty.json" 2>&1 \
    | grep -v "it/s\]" | tail -14
}

# ---- parallel (2 GPUs) -------------------------------------------------------------------------
stage_layouts_qwen3() {  # T=1 and T=2, every request kind
  need_gpus 2 || return
  local st=0 tp
  for tp in 1 2; do wla_run qwen3-0.6b-shape $tp 1 layouts_qwen3_t${tp}_p1 200 -- --sampling all || st=1; done
  return $st
}
stage_layouts_llama8b() {  # T=1 and T=2 every request kind, then P=2 greedy
  need_gpus 2 || return
  local st=0
  wla_run llama-3-8b-shape 1 1 layouts_llama8b_t1_p1 200 -- --sampling all || st=1
  wla_run llama-3-8b-shape 2 1 layouts_llama8b_t2_p1 200 -- --sampling all || st=1
  wla_run llama-3-8b-shape 1 2 layouts_llama8b_t1_p2 150 || st=1
  return $st
}
stage_dp_scaling() {  # `serve -dp 2` vs `-dp 1` through InferenceClient, the same load per replica
  need_gpus 2 || return
  timeout "$(lim 300)" "$PY" bench/dp_scaling.py --dp 1 2 --rounds 2 --num-requests "${DP_REQUESTS:-256}" --per-replica \
    --input-len 100:1024 --output-len 100:1024 --log-dir "${DP_LOG_DIR:-$OUT/dp_logs}" --out "$OUT/dp_scaling.json" \
    --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 --max-model-len 4096 2>&1 | tail -5
}
stage_allreduce() {  # TP all-reduce latency per path (NCCL, symmetric memory one-shot / two-shot) and size
  need_gpus 2 || return
  timeout "$(lim 150)" "$PY" bench/allreduce.py --out "$OUT/allreduce.json" 2>&1 | tail -20
}

# ---- stages outside the suites -----------------------------------------------------------------
stage_tpot_ab() {  # TPOT_RUNS: comma-separated env settings ("-": none), run in that order
  [ -n "${TPOT_RUNS:-}" ] || { echo "tpot_ab: set TPOT_RUNS, e.g. INFER_CLUSTER_FUSED_MLP=0,-,INFER_CLUSTER_FUSED_MLP=0,-"; return 2; }
  local st=0 e i=0 runs; IFS=, read -ra runs <<< "$TPOT_RUNS"
  for e in "${runs[@]}"; do i=$((i + 1)); [ "$e" = - ] && e=""
    echo "--- $i: TPOT ${e:-defaults}"
    tpot_run "tpot_ab_$i" $e || st=1
  done
  return $st
}
stage_workload_a_runs() {  # WLA_RUNS: comma-separated "model T P [ENV=VALUE ...] [--flag value ...]"
  local st=0 run i=0 runs model tp pp rest w envs flags
  IFS=, read -ra runs <<< "${WLA_RUNS:-llama-3-8b-shape 1 1,llama-3-8b-shape 2 1}"
  for run in "${runs[@]}"; do
    read -r model tp pp rest <<< "$run"; i=$((i + 1))
    envs=(); flags=()
    # NAME=VALUE before the first --flag is the environment; the rest are flags and their values
    for w in $rest; do case "${#flags[@]}:$w" in 0:*=*) envs+=("$w") ;; *) flags+=("$w") ;; esac; done
    wla_run "$model" "$tp" "$pp" "wla_${i}_${model%%-*}_t${tp}_p$pp${envs[*]:+_$(tag "${envs[*]}")}" \
      "${WLA_TIMEOUT:-150}" ${envs[@]+"${envs[@]}"} -- ${flags[@]+"${flags[@]}"} || st=1
  done
  return $st
}
stage_workload_a_trees() {  # AB_RUNS: comma-separated "new|old model T kind"; AB_OLD: the other tree
  [ -n "${AB_OLD:-}" ] && [ -n "${AB_RUNS:-}" ] || { echo "workload_a_trees: set AB_OLD (a tree) and AB_RUNS"; return 2; }
  local st=0 run runs which model tp kind tree site=${PYTHONPATH:-}
  site=${site%%:*}
  IFS=, read -ra runs <<< "$AB_RUNS"
  for run in "${runs[@]}"; do
    read -r which model tp kind <<< "$run"
    tree=$PWD; [ "$which" = old ] && tree=$(cd "$AB_OLD" && pwd)
    echo "--- $which $model workload A T=$tp --sampling $kind"
    (cd "$tree" && PYTHONPATH="${site:+$site:}$tree" timeout "$(lim "${WLA_TIMEOUT:-150}")" "$PY" bench/throughput.py \
      --model "$model" "${WLA[@]}" --tensor-parallel-size "$tp" --sampling "$kind" \
      --out "$OUT/ab_${which}_${model%%-*}_t${tp}_$kind.json" 2>&1 | grep -E "$WLA_LINES" | tail -3) || st=1
  done
  return $st
}
stage_tpot_trees() {  # batch-1 TPOT alternating this tree and OLD_TREE, twice
  [ -n "${OLD_TREE:-}" ] || { echo "tpot_trees: set OLD_TREE (another checkout, as plain files)"; return 2; }
  local st=0 i tree
  for i in 1 2; do
    for tree in "$PWD" "$OLD_TREE"; do
      echo "--- $i: TPOT $tree"
      tpot_in_tree "$tree" "$OUT/tpot_trees_${i}_$(basename "$tree").json" || st=1
    done
  done
  return $st
}
stage_gemv_sweep() {  # GEMV_SWEEP_ARGS, e.g. "--models llama-3-8b-tp2"; GEMV_SWEEP_S: the sweep's budget
  timeout "$(lim 300)" "$PY" bench/gemv.py --sweep --budget-s "${GEMV_SWEEP_S:-150}" ${GEMV_SWEEP_ARGS:-} \
    --out "$OUT/gemv_sweep.json" > "$OUT/gemv_sweep.log" 2>&1
  local st=$?
  grep -E "^    \(|^precompiled|not swept|Error| s on " "$OUT/gemv_sweep.log" | tail -40
  return $st
}
stage_int8_variants() {
  timeout "$(lim 420)" "$PY" bench/int8_decode.py --variants --iters 30 --out "$OUT/int8_variants.json" 2>&1 \
    | tee "$OUT/int8_variants.log" | tail -80
}
stage_int8_round2() {
  timeout "$(lim 420)" "$PY" bench/int8_decode.py --round2 --budget-s "${INT8R2_BUDGET_S:-270}" --iters 30 \
    --out "$OUT/int8_round2.json" 2>&1 | tee "$OUT/int8_round2.log" | tail -130
}
stage_decode_tune() {
  timeout "$(lim 420)" "$PY" bench/tune_decode.py --out "$OUT" ${DECODE_TUNE_ARGS:-} 2>&1 | tee "$OUT/decode_tune.log" | tail -40
}
stage_tpot_ablation() {
  timeout "$(lim 540)" "$PY" bench/tpot_ablation.py --variants "${ABLATION_VARIANTS:-base,prep,reduce,decode,attn,splitsum,o_nosplit,base}" \
    --model qwen3-0.6b-shape --max-model-len 4096 --out "$OUT/tpot_ablation.json" 2>&1 | grep -E "TPOT|failed|Error"
}
stage_decode_timeline() {
  timeout "$(lim 200)" "$PY" bench/decode_timeline.py --steps 10 ${TIMELINE_FLAGS:-} --out "$OUT/decode_timeline.json" 2>&1 \
    | tail -"${TIMELINE_LINES:-290}"
}
stage_decode_kernels() {
  timeout "$(lim 120)" "$PY" bench/decode_kernels.py --steps 10 > "$OUT/decode_kernels.log" 2>&1
  local st=$?
  sed -n 1,40p "$OUT/decode_kernels.log"
  return $st
}
stage_decode_persistent() {  # bf16 decode attention: the persistent kernel's dispatch rule against its neighbours
  local st=0 i=0 cfg
  # default (persistent from 1.5 rounds, or for 0.75-1 round), the Triton kernel only, persistent
  # from one round (unsplit), persistent at every batch (split where the plan asks)
  for cfg in '{}' '{"persistent": false}' '{"persistent_min_rounds": 1}' '{"persistent_min_rounds": 0}'; do
    i=$((i + 1)); echo "--- $cfg"
    timeout "$(lim 100)" "$PY" bench/decode_grid.py --kv bf16 --spread 0.9 --longest-first \
      --batch ${DP_BATCHES:-32 64 96 128 256} --context 128 512 1024 2048 --iters 20 --bf16-config "$cfg" \
      --out "$OUT/decode_persistent_$i.json" 2>&1 | tail -21 || st=1
  done
  return $st
}
stage_decode_ncu() {  # one decode attention launch per KV dtype under Nsight Compute (bench/ncu_profile.py)
  local st=0 kv
  for kv in bf16 int8; do
    echo "--- $kv: ${NCU_CELL:=--batch 256 --context 1024}"
    timeout "$(lim 300)" "$PY" bench/ncu_profile.py --kernel _decode_kernel --out "$OUT/ncu" --name "decode_$kv" \
      -- "$PY" bench/decode_grid.py $NCU_CELL --kv $kv --spread 0.9 --longest-first --iters 2 --reps 1 \
      --out "$OUT/ncu/grid_$kv.json" 2>&1 | tail -50 || st=1
  done
  return $st
}
stage_gemm_ncu() {  # qkv, o, gate_up + SiLU, down of bench/gemm.py's layer chain, one launch each under ncu
  local st=0 i names=(qkv o gate_up down)
  for i in 0 1 2 3; do  # the chain launches them in this order, layer after layer
    echo "--- ${names[$i]} at ${GEMM_NCU_M:=256} rows"
    timeout "$(lim 150)" "$PY" bench/ncu_profile.py --kernel _gemm_kernel --skip $((4 + i)) --out "$OUT/ncu" \
      --name "gemm_${names[$i]}_m$GEMM_NCU_M" -- "$PY" bench/gemm.py --m "$GEMM_NCU_M" --replays 1 \
      --out "$OUT/ncu/gemm_chain.json" 2>&1 | grep -E "Duration|Throughput|Issue|Warps|^---|rror" | head -12 || st=1
  done
  return $st
}
stage_step_kernels() {
  local st=0 kv
  for kv in auto int8; do
    timeout "$(lim 150)" "$PY" bench/step_kernels.py --kv-cache-dtype $kv 2>&1 | grep -v "it/s\]" | tail -18 || st=1
  done
  return $st
}
stage_sampler() {  # SAMPLER_KINDS: the kinds; SAMPLER_FLAGS, e.g. "--profile" or "--cprofile"
  timeout "$(lim 150)" "$PY" bench/sampler_profile.py ${SAMPLER_KINDS:+--kinds "$SAMPLER_KINDS"} ${SAMPLER_FLAGS:-} \
    --out "$OUT/sampler_profile.json" 2>&1 | tee "$OUT/sampler_profile.log" | grep -v "^-\+ *$" | sed -n 1,60p
}
stage_mixed_step() { timeout "$(lim 200)" "$PY" bench/mixed_step.py --out "$OUT/mixed_step.json" 2>&1 | tail -20; }
stage_prepare_cost() { timeout "$(lim 120)" "$PY" bench/prepare_cost.py --device cuda --out "$OUT/prepare_cost.json" 2>&1 | tail -6; }
stage_workload_a_trace() {
  local st=0 kv trace; trace=$(mktemp -d)
  for kv in auto int8; do
    timeout "$(lim 240)" "$PY" bench/throughput.py --model qwen3-0.6b-shape "${WLA[@]}" --kv-cache-dtype $kv \
      --trace "$trace" --out "$OUT/workload_a_trace_$kv.json" 2>&1 | grep -v "it/s\]" | grep -vE "^\s*$" | tail -44 || st=1
  done
  cp "$trace"/*.summary.json "$OUT/" 2>/dev/null
  return $st
}
stage_host_tier_trace() {
  local trace; trace=$(mktemp -d)
  timeout "$(lim 300)" "$PY" bench/host_tier.py --num-requests 64 --trace "$trace" --out "$OUT/host_tier_trace.json" 2>&1 \
    | grep -v "it/s\]" | tail -40
  local st=$?
  cp "$trace"/*.summary.json "$OUT/" 2>/dev/null
  return $st
}
stage_backlog() {  # 1,024 requests against max_num_seqs 256: "seqs graph_max_tokens max_num_batched_tokens"
  local st=0 run seqs gmt mbt
  for run in "256 512 8192" "1024 512 8192" "1024 2048 8192" "1024 512 512"; do
    read -r seqs gmt mbt <<< "$run"
    echo "--- $seqs seqs, graph_max_tokens $gmt, max_num_batched_tokens $mbt"
    timeout "$(lim 150)" "$PY" bench/throughput.py --model qwen3-0.6b-shape "${WLA[@]}" --num-seqs "$seqs" \
      --graph-max-tokens "$gmt" --max-num-batched-tokens "$mbt" --out "$OUT/backlog_${seqs}_${gmt}_$mbt.json" 2>&1 \
      | grep -E "^infer-cluster|^phases|Error|error" | tail -3 || st=1
  done
  return $st
}
stage_targets() {  # each run right after its own roofline, so a share is the same machine's
  local st=0 seed kv suffix
  for seed in ${TARGET_SEEDS:-0 1 2}; do
    for kv in auto int8; do
      suffix=$([ $kv = int8 ] && echo _int8)
      timeout "$(lim 90)" "$PY" bench/roofline.py --model qwen3-0.6b-shape --kv-cache-dtype $kv --seed "$seed" \
        --out "$OUT/roofline_s$seed$suffix.json" > /dev/null 2>&1 || st=1
      timeout "$(lim 150)" "$PY" bench/throughput.py --model qwen3-0.6b-shape "${WLA[@]}" --kv-cache-dtype $kv \
        --seed "$seed" --step-timeline --out "$OUT/wla_s$seed$suffix.json" 2>&1 | grep -E "Error|error" | tail -3
      [ -f "$OUT/wla_s$seed$suffix.json" ] || st=1
    done
  done
  timeout "$(lim 120)" "$PY" bench/decode_grid.py --batch 256 --kv bf16 int8 --spread 0.9 --longest-first \
    --out "$OUT/decode_grid.json" > "$OUT/decode_grid.log" 2>&1 || st=1
  "$PY" bench/targets.py "$OUT" || st=1
  return $st
}
stage_tp_tail() {  # TAIL_SEQS long sequences at T=1 and T=2, then each with a profiler trace of rank 0
  need_gpus 2 || return
  local st=0 tp
  for tp in 1 2; do
    tail_run llama-3-8b-shape $tp "${TAIL_SEQS:-16}" "" tp_tail_t$tp --step-timeline || st=1
    tail_run llama-3-8b-shape $tp "${TAIL_SEQS:-16}" "" tp_tail_t${tp}_prof --step-timeline --trace "$(mktemp -d)" || st=1
  done
  return $st
}
stage_tp_step_timeline() {
  need_gpus 2 || return
  local st=0 tp
  for tp in 1 2; do
    wla_run llama-3-8b-shape $tp 1 tp_step_timeline_t$tp 120 -- --step-timeline || st=1
  done
  return $st
}
stage_gateway() {  # GATEWAY_DEVICES: "cpu cuda" (default) or one of them
  "$PY" -c "import fastapi, uvicorn, httpx, zmq" 2>/dev/null \
    || { echo "gateway: needs fastapi, uvicorn, httpx and pyzmq in the environment"; return 3; }
  local st=0 spec dev model serve_pid
  for spec in "cpu tiny-random" "cuda qwen3-0.6b-shape --load-format dummy --dtype bfloat16 --max-model-len 4096"; do
    set -- $spec; dev=$1; model=$2; shift 2
    case " ${GATEWAY_DEVICES:-cpu cuda} " in *" $dev "*) ;; *) continue ;; esac
    "$PY" -m infer_cluster serve --port 5655 --http-port 8100 --device "$dev" --model "$model" "$@" \
      > "$OUT/gateway_serve_$model.log" 2>&1 &
    serve_pid=$!
    "$PY" -c "import httpx, time
for _ in range(600):
    try:
        if httpx.get('http://127.0.0.1:8100/health', timeout=2).status_code == 200: break
    except httpx.HTTPError: pass
    time.sleep(0.5)"
    timeout "$(lim 300)" "$PY" -m infer_cluster --log-level WARNING bench --address tcp://127.0.0.1:5655 \
      --http http://127.0.0.1:8100 -n 5 --concurrency 1 --input-len 32 --output-len 16 --repeat 20 \
      --json "$OUT/gateway_latency_$model.json" 2>&1 | grep -v "^round" | tail -16 || st=1
    timeout "$(lim 300)" "$PY" -m infer_cluster --log-level WARNING bench --address tcp://127.0.0.1:5655 \
      --http http://127.0.0.1:8100 -n 128 --concurrency 32 --input-len 32 --output-len 64 --repeat 8 \
      --json "$OUT/gateway_throughput_$model.json" 2>&1 | grep -v "^round" | tail -16 || st=1
    kill -TERM "$serve_pid"; wait "$serve_pid"
  done
  return $st
}

# ---- apps: what applications turn on (prompt TTFT, speculative decoding, structured outputs) ----
stage_ttft_ladder() {  # prompt TTFT through the mixed-step graphs of a 256-sequence engine (TTFT_CASES)
  local st=0 case prompt gmax cases
  IFS=, read -ra cases <<< "${TTFT_CASES:-300 512,1100 512,1100 2048,700 2048}"
  for case in "${cases[@]}"; do
    read -r prompt gmax <<< "$case"
    echo "--- prompt $prompt, graph_max_tokens $gmax"
    timeout "$(lim 100)" "$PY" bench/latency.py --prompt-len "$prompt" --graph-max-tokens "$gmax" --max-num-seqs 256 \
      --output-len 16 --repeats 3 --show-first-steps --out "$OUT/ttft_${prompt}_$gmax.json" > "$OUT/ttft_${prompt}_$gmax.log" 2>&1 || st=1
    grep -E "repeat 3:|\"ttft_ms\"|\"tpot_ms_p50\"" "$OUT/ttft_${prompt}_$gmax.log" | cut -c1-240
  done
  return $st
}
spec_run() {  # spec_run NAME [flags]: bench/spec_decode.py at k = SPEC_K, batch 1 and 8, interleaved with off
  local name=$1; shift
  timeout "$(lim 240)" "$PY" bench/spec_decode.py --k "${SPEC_K:-15}" --batch 1 8 --rounds 6 "$@" \
    --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1; local rc=$?
  grep -E "batch +[0-9]+:|on/off|identical" "$OUT/$name.log" | cut -c1-200
  return $rc
}
stage_spec_decode() { spec_run spec_decode; }  # n-gram speculation on the real SmolLM2
stage_spec_decode_schema() { spec_run spec_decode_schema --schema; }  # the same, every answer under a JSON schema
# workload A with none / half / all requests under a JSON schema, SmolLM2's tokenizer (structured.py)
structured_run() {
  local name=$1; shift
  timeout "$(lim 150)" "$PY" bench/structured.py --model qwen3-0.6b-shape --load-format dummy --dtype bfloat16 \
    --num-seqs 256 --prompt-len 100 1024 --output-len 100 1024 --max-model-len 4096 \
    --tokenizer smollm2-135m-instruct "$@" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1; local rc=$?
  grep -E "^ *(none|half|all):|/ none|TPOT|compile of" "$OUT/$name.log" | cut -c1-200
  return $rc
}
stage_structured() { structured_run structured; }
stage_structured_sampled() { structured_run structured_sampled --temperature 0.8 --top-p 0.95; }

# ---- the run -----------------------------------------------------------------------------------
(($#)) || { usage; exit 2; }
stages=() limited=1
for arg in "$@"; do
  case $arg in
    -h|--help) usage; exit 0 ;;
    full) limited=0; for s in $SUITE_ORDER; do stages+=(${SUITES[$s]}); done ;;
    *) if [ -n "${SUITES[$arg]+x}" ]; then stages+=(${SUITES[$arg]})
       elif declare -F "stage_$arg" > /dev/null; then stages+=("$arg")
       else echo "unknown suite or stage: $arg" >&2; usage >&2; exit 2; fi ;;
  esac
done
BUDGET_S=${BENCH_BUDGET_S:-570}
((limited)) || BUDGET_S=$((10 ** 9))
DEADLINE=$((SECONDS + BUDGET_S))
summary=() failed=0
for stage in "${stages[@]}"; do
  left=$((DEADLINE - SECONDS)) need=${MIN_S[$stage]:-$DEFAULT_MIN_S}
  if ((left < need)); then
    echo "=== $stage skipped: ${left} s left of the ${BUDGET_S} s budget, it needs ${need}"
    summary+=("$(printf '%-22s %6s  %s' "$stage" - "skipped (budget)")"); failed=1; continue
  fi
  echo "=== $stage $(date -u +%H:%M:%S)"
  t0=$SECONDS
  "stage_$stage"; rc=$?
  case $rc in 0) status=ok ;; 3) status="skipped (this machine)" ;; *) status="failed ($rc)"; failed=1 ;; esac
  summary+=("$(printf '%-22s %6d  %s' "$stage" $((SECONDS - t0)) "$status")")
done
echo "=== summary (results in $OUT)"
printf '%s\n' "${summary[@]}"
exit $failed
