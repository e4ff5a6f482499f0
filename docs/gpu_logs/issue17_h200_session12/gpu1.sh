# call 1: where the batch's CPU time goes (bench/cpu_by_process.py around the harness, 7 builds at
# once, the host PCH, beside the KernelBench-style baseline); then the same harness run again, to see
# how far the throughput ratio moves between two runs of one build
# (7 builds at once was then the working tree's default; the commit that records these runs sets 4 again)
set -x
timeout 270 python bench/cpu_by_process.py -- python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 12 --baseline-n 0 --stability-runs 0 --cache-root /tmp/p1 --json-out $OUT/tp_prof.json > $OUT/tp_prof.log 2>&1; grep -E "wall|noise|KernelBench-style:|ratio|per phase|^\|" $OUT/tp_prof.log | tail -30
timeout 260 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 12 --baseline-n 0 --stability-runs 0 --cache-root /tmp/p2 --json-out $OUT/tp_rep.json > $OUT/tp_rep.log 2>&1; grep -E "wall|noise|KernelBench-style:|ratio|per phase" $OUT/tp_rep.log
