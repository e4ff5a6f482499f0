# first call of session 16 (session 15's gpu3.sh, run as is). Is the window-level shift the GPU's clock?
# nvidia-smi samples the SM and memory clocks and power every 100 ms, beside: process_floor.py with
# 5 fresh processes per task (the floor of plain CUDA-event timing across processes), then a
# 32-candidate batch twice, the second with every build cached (timing alone)
set -x; mkdir -p /tmp/logs
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 100 > /tmp/logs/clocks.csv &
SMI=$!
date +%s.%N; PYTHONUNBUFFERED=1 timeout 300 python docs/gpu_logs/issue17_h200_session15/process_floor.py 5 2>&1 | tee /tmp/logs/process_floor.log
for name in cold warm; do
  date +%s.%N; timeout 105 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --cache-root /tmp/c --json-out $OUT/$name.json > /tmp/logs/$name.log 2>&1
  grep -E "in-batch noise" /tmp/logs/$name.log
done
kill $SMI; tar czf $OUT/logs.tgz -C /tmp/logs .
