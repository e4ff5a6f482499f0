# third call of session 16: the floor of plain CUDA-event timing across fresh processes, larger:
# 9 processes per task, so 4 emulated batches of 8 identical pairs, beside the GPU's clock samples
set -x; mkdir -p /tmp/logs
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 100 > /tmp/logs/clocks3.csv &
SMI=$!
nvidia-smi -q -d PERFORMANCE; date +%s.%N; PYTHONUNBUFFERED=1 timeout 540 python docs/gpu_logs/issue17_h200_session15/process_floor.py 9 2>&1 | tee /tmp/logs/process_floor9.log
nvidia-smi -q -d PERFORMANCE; kill $SMI; tar czf $OUT/logs3.tgz -C /tmp/logs .
