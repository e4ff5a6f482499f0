# Second call of session 17, on d41c8e6 (ran): four more batches, timing_processes 2 and 1 in turn, so that
# each setting has three runs side by side in one session (pair noise and candidates per minute).
set -x; mkdir -p /tmp/logs
for run in b c; do
  for k in 2 1; do
    date +%s.%N; timeout 120 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 \
      --stability-runs 0 --timing-processes $k --json-out $OUT/k${k}_$run.json > /tmp/logs/k${k}_$run.log 2>&1
    grep -E "candidates/min|in-batch noise" /tmp/logs/k${k}_$run.log
  done
done
tar czf $OUT/logs2.tgz -C /tmp/logs .
