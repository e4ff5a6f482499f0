# call 5 (~320 s of device time left): a fifth batch alone at the default build count
set -x
timeout 120 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --cache-root /tmp/d5 --json-out $OUT/default_5.json > $OUT/default_5.log 2>&1; grep -E "wall|noise|^\|" $OUT/default_5.log | tail -14
