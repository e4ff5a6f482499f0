# First call of session 17, on d41c8e6 (ran; results in PERFORMANCE.md, "H200, seventeenth session";
# --timing-processes was removed after it): kernel_eval's GPU tests, then one batch at 2 and one at 1.
set -x; mkdir -p /tmp/logs
timeout 300 python -m pytest -q -m gpu tests/test_kernel_eval.py 2>&1 | tail -15
for k in 2 1; do
  date +%s.%N; timeout 120 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 \
    --stability-runs 0 --timing-processes $k --json-out $OUT/k${k}_a.json > /tmp/logs/k${k}_a.log 2>&1
  grep -E "candidates/min|in-batch noise" /tmp/logs/k${k}_a.log
done
tar czf $OUT/logs1.tgz -C /tmp/logs .
