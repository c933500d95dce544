#!/bin/bash
# GPU 0: a one-GPU tiny fleet, then two tiny runs attached to it (their first steps through the warm controller).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PATH=/tmp/site/bin:$PATH
python3 -m compileall -q -j 16 /tmp/site > /dev/null 2>&1; unset PYTHONDONTWRITEBYTECODE
python3 -m rlfleet.cli model tiny --out /tmp/models/tiny 2>&1 | tail -1
export CUDA_VISIBLE_DEVICES=0 RLFLEET_FLEET_DIR=/tmp/fleets9 PREFECT_HOME=/tmp/ph9
s=$(date +%s)
python3 -m rlfleet.cli fleet up @ examples/tiny/fleet.toml --model.path /tmp/models/tiny --gpu-ids '["0"]' \
  --trainer-gpu-ids '["0"]' --inference.gpu-memory-utilization 0.45 --api-port 4320 > $OUT/fleet.log 2>&1 &
F=$!
until grep -q "fleet tiny up" $OUT/fleet.log; do sleep 0.5; kill -0 $F 2>/dev/null || break; [ $(( $(date +%s) - s )) -gt 150 ] && break; done
echo "fleet up in $(( $(date +%s) - s )) s"
for r in 1 2; do
  t0=$(date +%s.%N)
  timeout 60 python3 -m rlfleet.cli rl @ examples/tiny/rl.toml --model.path /tmp/models/tiny --output-dir /tmp/r$r --max-steps 2 \
    --fleet tiny --deployment.num-train-gpus 1 --wandb.mode disabled > $OUT/run$r.log 2>&1
  echo "run $r rc=$? command at $(date -d @$t0 +%T.%N)"; grep -h "Beginning flow\|step 0 (" $OUT/run$r.log | cut -c1-230
  sleep 12
done
grep -h "warm\|precompile" /tmp/fleets9/tiny/logs/*/warm_0.log 2>/dev/null | tail -4
python3 -m rlfleet.cli fleet down tiny > /dev/null 2>&1; kill $F 2>/dev/null
