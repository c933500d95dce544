#!/bin/bash
# The pinned GPU stack (vLLM 0.32.0, torch 2.13.0) on one lent GPU, in few calls (docs/gpus.md):
#   bash benchmarks/gpu_session.sh smoke       # torch 2.13 on the image's CUDA 13: import, a matmul, NCCL
#   bash benchmarks/gpu_session.sh soak        # the chaos soak (SmolLM2, cuda_ipc, k = 1) in the background
#   bash benchmarks/gpu_session.sh tests       # pytest -m gpu
#   bash benchmarks/gpu_session.sh quickstart  # make run-gpu as a user runs it, the stack already in place
#   bash benchmarks/gpu_session.sh collect     # wait for the soak to end; its JSON and logs to $OUT
#   bash benchmarks/gpu_session.sh sizes       # benchmarks/sizes.py's rows (ROWS) one after another, in the background
#   bash benchmarks/gpu_session.sh harvest     # wait (at most HARVEST_S) for the rows; their JSON and logs to $OUT
# The site is the gpu-kit's (../shared/gpu-kit/build.sh, then scripts/gpu_kit_extras.sh), unpacked to
# /tmp/site (`SMOKE_ONLY=1 bash .gpu/sh/a.sh`); SmolLM2's GGUF is /tmp/models/$(cat .gpu/m0/NAME).
# Results go to $OUT.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
[ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ] && PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=180   # a cold machine's first server start
GGUF=/tmp/models/$(cat .gpu/m0/NAME 2>/dev/null || echo SmolLM2-135M-Instruct.Q4_1.gguf)
SMOL=/tmp/models/smollm2
smollm2() { [ -f $SMOL/config.json ] || python3 -m rlfleet.cli model smollm2 --out $SMOL --gguf "$GGUF"; }
ROWS=${ROWS:-"qwen3-8b:lora qwen3-4b:full qwen2.5-1.5b:full"}   # model:mode, run in this order
case ${1:?smoke, soak, tests, quickstart, collect, sizes or harvest} in
  smoke)  # after the kit's unpack: the wheels torch 2.13 needs beside the image's torch 2.11 set
    # (NCCL 2.29, cuDNN 9.20, torchvision 0.28; scripts/gpu_kit_extras.sh cut them into w parts)
    for first in /tmp/stage/w*_0; do
      [ -f "$first" ] || continue
      group=${first%_0}
      [ -f "$group.done" ] && continue
      cat "$group"_* > /tmp/extra.whl && python3 -m zipfile -e /tmp/extra.whl /tmp/site && touch "$group.done"
    done
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/smoke.log"
    python3 - <<'PY' 2>&1 | tee -a "$OUT/smoke.log"
import os, torch, torch.distributed as dist
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version())
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize(); print("matmul", float((a @ a).float().abs().mean()))
x = torch.nn.functional.conv2d(torch.randn(1, 3, 32, 32, device="cuda"), torch.randn(8, 3, 3, 3, device="cuda"))
print("cudnn conv", tuple(x.shape))
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
t = torch.ones(8, device="cuda"); dist.all_reduce(t); print("nccl all_reduce", float(t.sum()))
dist.destroy_process_group()
import vllm, transformers, prefect; print("vllm", vllm.__version__, "transformers", transformers.__version__, "prefect", prefect.__version__)
PY
    smollm2 2>&1 | tail -2
    ;;
  soak)  # >= 20 minutes of faults over two runs, each from its first seconds
    smollm2 > /dev/null 2>&1
    setsid nohup python3 benchmarks/chaos.py --duration-s ${SOAK_S:-1200} --runs 2 --max-steps 400 \
      --gap-s 5 25 --max-wait-s 30 --finish-steps 3 --workdir /tmp/gsoak --out /tmp/gsoak/chaos_gpu.json \
      --model.path $SMOL --deployment.num-inference-gpus 1 --deployment.num-train-gpus 1 \
      --weights.transport cuda_ipc --orchestrator.max-async-level 1 --inference.gpu-memory-utilization 0.25 \
      > /tmp/gsoak.log 2>&1 < /dev/null &
    echo "soak started: pid $!"
    ;;
  tests)
    timeout ${TESTS_S:-540} python3 -m pytest -m gpu -p no:cacheprovider -q -rs --junitxml "$OUT/gpu_tests.xml" \
      tests/test_gpu.py > "$OUT/gpu_tests.log" 2>&1
    echo "pytest rc=$?"; tail -30 "$OUT/gpu_tests.log"
    ;;
  quickstart)
    s=$(date +%s)
    timeout ${QS_S:-540} make run-gpu GPU_STAMP= RLFLEET="python3 -m rlfleet.cli" SMOLLM2_GGUF="$GGUF" \
      > "$OUT/quickstart.log" 2>&1
    echo "make run-gpu rc=$? wall=$(( $(date +%s) - s )) s"
    grep -E "eval|pass@1|step 0 |run smollm2" "$OUT/quickstart.log" | tail -12
    cp outputs/smollm2-gpu/summary.json "$OUT/quickstart_summary.json" 2>/dev/null
    ;;
  collect)
    while pgrep -f benchmarks/chaos.py > /dev/null && [ $SECONDS -lt ${COLLECT_S:-560} ]; do sleep 5; done
    tail -40 /tmp/gsoak.log
    cp /tmp/gsoak/chaos_gpu.json "$OUT/" 2>/dev/null
    tar czf "$OUT/gsoak_logs.tgz" /tmp/gsoak.log /tmp/gsoak/run*/controller.log 2>/dev/null
    ;;
  sizes)  # each row its own process under a time limit: one that hangs or fails leaves the next its turn
    mkdir -p /tmp/sizes_out
    setsid nohup bash -c 'for r in '"$ROWS"'; do
        m=${r%%:*}; mode=${r#*:}; echo "$(date +%T) row $m $mode start" >> /tmp/sizes_out/progress.log
        (cd benchmarks && timeout ${ROW_S:-480} python3 sizes.py --model $m --mode $mode --steps ${STEPS:-4} \
          --out /tmp/sizes_out/sizes_${m}_${mode}.json -- --wandb.mode disabled) > /tmp/sizes_out/$m-$mode.log 2>&1
        echo "$(date +%T) row $m $mode rc=$?" >> /tmp/sizes_out/progress.log
        rm -rf /tmp/sizes/models/$m /tmp/sizes/runs/${m}_$mode/checkpoints /tmp/sizes/runs/${m}_$mode/weights  # the disk
      done; touch /tmp/sizes_out/done' > /dev/null 2>&1 < /dev/null &
    echo "rows started: $ROWS"
    ;;
  harvest)
    while [ ! -f /tmp/sizes_out/done ] && [ $SECONDS -lt ${HARVEST_S:-560} ]; do sleep 5; done
    cat /tmp/sizes_out/progress.log; nvidia-smi --query-gpu=memory.used --format=csv
    cp /tmp/sizes_out/*.json "$OUT/" 2>/dev/null
    tar czf "$OUT/sizes_logs.tgz" /tmp/sizes_out/*.log \
      $(find /tmp/sizes/runs -path '*/logs/*' -name '*.log' 2>/dev/null) \
      $(find /tmp/sizes/runs -path '*/configs/*' 2>/dev/null) 2>/dev/null
    for f in /tmp/sizes_out/sizes_*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d=d.get('results', d); print(d['model'], d['mode'], d.get('ok'), d.get('peak_memory_gib'), d.get('train_tokens_per_s'), d.get('mfu'), d.get('memory_plan'), d.get('error','')[:600])" $f; done
    ;;
esac
