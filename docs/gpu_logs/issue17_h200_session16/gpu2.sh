# second call of session 16: the >= 1 ms kernel judged 5 times in fresh batches (stability), then
# three more cold 32-candidate batches for the pair noise, with the GPU's clocks sampled every 100 ms
set -x; mkdir -p /tmp/logs
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 100 > /tmp/logs/clocks2.csv &
SMI=$!
date +%s.%N; timeout 200 python bench/harness.py --device cuda --n-candidates 0 --baseline-n 0 --kernelbench-n 0 --stability-runs 5 \
  --stability-task builtin/level1/09_matmul --stability-replace "M, K, N = 2000, 1040, 1030" "M, K, N = 4096, 4096, 4096" \
  --json-out $OUT/stability.json > /tmp/logs/stability.log 2>&1; echo "rc=$?"; tail -15 /tmp/logs/stability.log
for i in 1 2 3; do
  date +%s.%N; timeout 105 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --json-out $OUT/cold$i.json > /tmp/logs/cold$i.log 2>&1
  grep -E "in-batch noise|candidates/min" /tmp/logs/cold$i.log
done
kill $SMI; tar czf $OUT/logs2.tgz -C /tmp/logs .
