#!/bin/bash
# benchmarks/learning_vs_trl.py on a 4-GPU host, one run per GPU, in two waves of <= 10 minutes:
#   bash benchmarks/learning_vs_trl_gpu.sh compare   # rlfleet sync and TRL, seeds 0 and 1
#   bash benchmarks/learning_vs_trl_gpu.sh one_seed  # rlfleet sync, k = 1 and TRL, seed 0; GPU 3: the sizing checks
#   bash benchmarks/learning_vs_trl_gpu.sh seed1     # TRL and k = 1 seed 1, k = 2 (m = k) and LoRA seed 0
#   bash benchmarks/learning_vs_trl_gpu.sh reason    # long generations: TRL, k = 1, k = 2; GPU 3: the sizing checks
#   bash benchmarks/learning_vs_trl_gpu.sh shared    # a one-GPU host: TRL and k = 1 started together on GPU 0
#   bash benchmarks/learning_vs_trl_gpu.sh cold      # a one-GPU host: k = 1 then TRL (ORDER="trl rlfleet"), each
#                                                    # alone on GPU 0 with its own empty compile caches; K=2: k = 2
#   bash benchmarks/learning_vs_trl_gpu.sh offpolicy # a one-GPU host: long samples at k = 1, max_off_policy_steps
#                                                    # 1 (m = k) then 3 (the default; ARMS="3": that one alone)
# MODEL (default /tmp/models/smollm2) is `rlfleet model smollm2`'s output; results go to $OUT/lvt.
# Each rlfleet run gets its own vLLM port; TRL picks free ports itself. On an H200, H100_SHARE=0.69
# leaves the 1.5B trainer what vLLM's 0.45 leaves it on an 80 GB H100 (~44 GB).
set -u
M=${MODEL:-/tmp/models/smollm2}; R=${OUT:-/tmp/gpu-out}/lvt; mkdir -p "$R"
STEPS=${STEPS:-100}; LIMIT=${LIMIT:-540}
B=(python3 benchmarks/learning_vs_trl.py --model "$M" --steps "$STEPS" --eval-interval 10 --time-limit "$LIMIT")
lane() {  # lane GPU NAME ARGS...: one run on one GPU, its output beside its JSON
  local gpu=$1 name=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu "${B[@]}" "$@" --out "$R/$name.json" > "$R/$name.driver.log" 2>&1 &
}
sizing() {  # the trainer's sizing on GPU 3: the long-tail job at micro-batch-size 8, then 1.5B full FT
    (export CUDA_VISIBLE_DEVICES=3
     timeout 280 python3 benchmarks/long_tail.py --device cuda --shape 05b --only rlfleet --no-peak --steps 4 \
       --variants "mbs8=--orchestrator.micro-batch-size 8" --logs "$R/lt_logs" --out "$R/long_tail_mbs8.json" \
       > "$R/long_tail_mbs8.log" 2>&1
     timeout 260 python3 benchmarks/gpu_loop.py --shapes 15b --transports cuda_ipc --steps 5 --warmup 1 \
       --work /tmp/gl15 --out "$R/gpu_loop_15b.json" -- --wandb.mode disabled \
       --inference.gpu-memory-utilization "${H100_SHARE:-0.45}" > "$R/gpu_loop_15b.log" 2>&1
     cp /tmp/gl15/15b_cuda_ipc/logs/trainer/rank_0.log "$R/gpu_loop_15b_trainer.log" 2>/dev/null)
}
# the one-GPU cold pair's two runs, each vLLM at 0.3 of GPU 0 (`shared` and `cold`); K: rlfleet's k
pair_trl() { lane 0 trl_sync_s0 --framework trl --seed 0 --trl-vllm-memory 0.3; }
pair_rlfleet() {
  local k=${K:-1}
  lane 0 "rlfleet_k${k}_s0" --framework rlfleet --seed 0 --variant "k$k" --inference.port 8150 \
    --orchestrator.max-async-level "$k" --orchestrator.max-off-policy-steps "$k" --inference.gpu-memory-utilization 0.3
}
case ${1:-compare} in
  compare)
    lane 0 rlfleet_sync_s0 --framework rlfleet --seed 0 --inference.port 8150
    lane 1 rlfleet_sync_s1 --framework rlfleet --seed 1 --inference.port 8160
    lane 2 trl_sync_s0 --framework trl --seed 0
    lane 3 trl_sync_s1 --framework trl --seed 1
    ;;
  one_seed)  # one machine call: sync and TRL, k = 1, and the sizing checks (below) on GPU 3
    lane 0 rlfleet_sync_s0 --framework rlfleet --seed 0 --inference.port 8150
    lane 1 trl_sync_s0 --framework trl --seed 0
    lane 2 rlfleet_k1_s0 --framework rlfleet --seed 0 --variant k1 --inference.port 8170 \
      --orchestrator.max-async-level 1 --orchestrator.max-off-policy-steps 1
    sizing &
    ;;
  seed1)  # the second seed of one_seed's runs, and the async and LoRA variants
    lane 0 trl_sync_s1 --framework trl --seed 1
    lane 1 rlfleet_k1_s1 --framework rlfleet --seed 1 --variant k1 --inference.port 8150 \
      --orchestrator.max-async-level 1 --orchestrator.max-off-policy-steps 1
    lane 2 rlfleet_k2_s0 --framework rlfleet --seed 0 --variant k2 --inference.port 8160 \
      --orchestrator.max-async-level 2 --orchestrator.max-off-policy-steps 2
    lane 3 rlfleet_lora_s0 --framework rlfleet --seed 0 --variant lora --inference.port 8170 \
      --orchestrator.max-async-level 1 --orchestrator.max-off-policy-steps 1 \
      --trainer.lora.rank 16 --trainer.lora.alpha 32 --lr 3e-5
    ;;
  reason)  # long, variable generations (examples/smollm2/reason.toml); GPU 3: the sizing checks
    L=(--job examples/smollm2/reason.toml --max-tokens "${REASON_TOKENS:-1024}")
    lane 0 trl_sync_s0 "${L[@]}" --framework trl --seed 0
    lane 1 rlfleet_k1_s0 "${L[@]}" --framework rlfleet --seed 0 --variant k1 --inference.port 8150 \
      --orchestrator.max-async-level 1 --orchestrator.max-off-policy-steps 1
    lane 2 rlfleet_k2_s0 "${L[@]}" --framework rlfleet --seed 0 --variant k2 --inference.port 8160 \
      --orchestrator.max-async-level 2 --orchestrator.max-off-policy-steps 2
    sizing &
    ;;
  shared)  # both on GPU 0, each vLLM at 0.3 of it (docs/benchmarks/startup.md, the cold pair)
    pair_trl; pair_rlfleet
    ;;
  offpolicy)  # does keeping the samples that span 3 weight loads (m = 3) learn as m = k does?
    L=(--job examples/smollm2/reason.toml --max-tokens "${REASON_TOKENS:-1024}" --framework rlfleet --seed 0
       --orchestrator.max-async-level 1 --inference.gpu-memory-utilization 0.3)
    # one after the other: two trainers sized at once on one GPU each count the other's memory as free
    for m in ${ARMS:-1 3}; do
      lane 0 "rlfleet_k1m${m}_s0" "${L[@]}" --variant "k1m$m" --inference.port 8150 --orchestrator.max-off-policy-steps "$m"
      wait
    done
    ;;
  cold)  # one after the other: sharing a GPU, TRL's vLLM can find no memory for its KV cache
    for fw in ${ORDER:-rlfleet trl}; do
      C=$(mktemp -d /tmp/cold_caches_XXXX)  # what a host that never ran either has
      export VLLM_CACHE_ROOT=$C/vllm TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor CUDA_CACHE_PATH=$C/cuda
      "pair_$fw"
      wait
    done
    ;;
esac
wait
for f in "$R"/*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], d.get('status'), [(p.get('step'), p.get('pass@1')) for p in d.get('curve', [])][-3:])" "$f" 2>/dev/null; done
grep -h "micro-batches:\|activation checkpointing turned\|trainer micro-batches\|Error\|refus" "$R"/*.log "$R"/lt_logs/* 2>/dev/null | cut -c1-400 | sort | uniq | head -20
# a device call brings back at most 8 files: the logs travel as one archive
tar czf "$R/logs.tgz" -C "$R" $(cd "$R" && ls -d *.log lt_logs 2>/dev/null) && rm -rf "$R"/*.log "$R/lt_logs"
