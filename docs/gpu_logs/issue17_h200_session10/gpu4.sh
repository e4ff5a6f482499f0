# call 4: the >= 1 ms kernel judged 5 times in fresh batches, kept CPUs (the default) then none, in one call
set -x
S='python bench/harness.py --device cuda --n-candidates 0 --kernelbench-n 0 --baseline-n 0 --stability-runs 5 --stability-task builtin/level1/09_matmul --blocks --cache-root /tmp/sc'
timeout 200 $S --stability-replace "M, K, N = 2000, 1040, 1030" "M, K, N = 4096, 4096, 4096" --timing-cpus 2 > $OUT/stab_c2.log 2>&1; grep -E "^stability" $OUT/stab_c2.log
timeout 170 $S --stability-replace "M, K, N = 2000, 1040, 1030" "M, K, N = 4096, 4096, 4096" --timing-cpus 0 > $OUT/stab_c0.log 2>&1; grep -E "^stability" $OUT/stab_c0.log
