#!/bin/bash
# The GPU runs issues 53 and 54 still need, one per GPU of a 4-GPU host, in one device call of <= 10 min
# (GPU kit on PYTHONPATH, see ../shared/gpu-kit/README.md; results and logs to $OUT/loop):
#   bash benchmarks/loop_gpu.sh long_tail   # GPU 0: TRL on the long-tail job (a whole call: ~130 s start + ~230 s a step)
#                                           # GPU 1: rlfleet on it, micro_batch_size 8, k = 1, profiled at step 2
#                                           # GPU 2: job (a) 0.5B on one shared GPU, profiled at step 3
#                                           # GPU 3: fleet_start.py --gpus 3: cold runs, then a one-GPU fleet's first step and eval
# Each lane's temp dirs are kept (TMPDIR under $OUT/loop/tmp_<lane>): a run cut by the call's limit keeps its
# vLLM and trainer logs and its profile; the end tars them (a device call brings back at most 8 files).
set -u
R=${OUT:-/tmp/gpu-out}/loop; mkdir -p "$R"
T=${T:-540}
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=180
VS=(--device cuda --shape 05b --orchestrator.max-tokens 4096 --inference.max-model-len 4200
    --orchestrator.max-async-level 1 --weights.transport cuda_ipc --orchestrator.micro-batch-size 8)
lane() {  # lane GPU NAME CMD...: one run on one GPU, its own Prefect home and temp dir
  local gpu=$1 name=$2; shift 2
  mkdir -p "$R/tmp_$name" "$R/home_$name"
  CUDA_VISIBLE_DEVICES=$gpu TMPDIR="$R/tmp_$name" PREFECT_HOME="$R/home_$name" timeout "$T" "$@" \
    > "$R/$name.log" 2>&1 &
}
case ${1:-long_tail} in
  long_tail)
    lane 0 trl python3 benchmarks/vs_trl.py "${VS[@]}" --only trl --trl-vllm --steps 2 --out "$R/vs_trl_trl.json"
    lane 1 mbs8 python3 benchmarks/vs_trl.py "${VS[@]}" --only rlfleet --steps 6 --trainer.profile-step 2 \
      --out "$R/vs_trl_mbs8.json"
    lane 2 job_a python3 benchmarks/long_tail.py --device cuda --shape 05b --steps 8 --only rlfleet --no-peak \
      --eos-rate 0.002 --trainer.lr 1e-7 --trainer.profile-step 3 \
      --variants "shared-1=--weights.transport cuda_ipc --orchestrator.max-async-level 1" --out "$R/long_tail_05b.json"
    lane 3 fleet python3 benchmarks/fleet_start.py --gpus 3 --reps 2 --out "$R/fleet_start_gpu.json"
    ;;
  *) echo "usage: $0 long_tail" >&2; exit 2 ;;
esac
wait
grep -h "step [0-9]* (\|micro-batches:\|Error\|refused" "$R"/*.log | cut -c1-300 | tail -40
find "$R"/tmp_* -name 'profile_step_*.txt' -exec cp {} "$R/" \;
# the logs only: a temp dir also holds the runs' models (a GiB at 0.5B)
(cd "$R" && ls *.log; find tmp_* -type f \( -name '*.log' -o -name 'profile_step_*' \)) 2>/dev/null \
  | tar czf "$R/logs.tgz" -C "$R" -T - && rm -rf "$R"/*.log "$R"/tmp_* "$R"/home_*
