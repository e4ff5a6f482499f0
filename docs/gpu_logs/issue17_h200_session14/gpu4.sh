# call 4 (the machine still warm, ~480 s of device time left): a fourth batch alone at the default
# build count, and the stability run again (call 2's was 3.10%)
set -x
timeout 130 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --cache-root /tmp/d4 --json-out $OUT/default_4.json > $OUT/default_4.log 2>&1; grep -E "wall|noise|^\|" $OUT/default_4.log | tail -14
timeout 170 python bench/harness.py --device cuda --n-candidates 0 --kernelbench-n 0 --baseline-n 0 --stability-runs 5 --stability-task builtin/level1/09_matmul --blocks --cache-root /tmp/sc2 --stability-replace "M, K, N = 2000, 1040, 1030" "M, K, N = 4096, 4096, 4096" > $OUT/stability_2.log 2>&1; grep -E "^stability" $OUT/stability_2.log
