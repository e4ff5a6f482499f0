# call 2: the default build count beside the KernelBench-style baseline in the same run, and a third
# batch alone; then the >= 1 ms kernel judged 5 times in fresh batches (stability)
set -x
timeout 260 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 12 --baseline-n 0 --stability-runs 0 --cache-root /tmp/b1 --json-out $OUT/default_with_baseline.json > $OUT/default_with_baseline.log 2>&1; grep -E "wall|noise|KernelBench-style:|ratio|per phase|^\|" $OUT/default_with_baseline.log | tail -22
timeout 140 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --cache-root /tmp/d3 --json-out $OUT/default_3.json > $OUT/default_3.log 2>&1; grep -E "wall|noise|^\|" $OUT/default_3.log | tail -14
timeout 170 python bench/harness.py --device cuda --n-candidates 0 --kernelbench-n 0 --baseline-n 0 --stability-runs 5 --stability-task builtin/level1/09_matmul --blocks --cache-root /tmp/sc --stability-replace "M, K, N = 2000, 1040, 1030" "M, K, N = 4096, 4096, 4096" > $OUT/stability.log 2>&1; grep -E "^stability" $OUT/stability.log
