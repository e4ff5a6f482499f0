# call 2: the kept-CPU mechanism on CUDA, then pair noise with and without kept CPUs, in turn, cold builds
set -x
timeout 120 python -m pytest -m gpu -q tests/test_kernel_eval.py -k "kept_cpus" > $OUT/pytest_kept_cpus.log 2>&1; tail -3 $OUT/pytest_kept_cpus.log
H="python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0"
timeout 170 $H --timing-cpus 2 --json-out $OUT/pairs_c2_1.json > $OUT/pairs_c2_1.log 2>&1; grep -E "wall|noise" $OUT/pairs_c2_1.log
timeout 170 $H --timing-cpus 0 --json-out $OUT/pairs_c0_1.json > $OUT/pairs_c0_1.log 2>&1; grep -E "wall|noise" $OUT/pairs_c0_1.log
timeout 170 $H --timing-cpus 2 --json-out $OUT/pairs_c2_2.json > $OUT/pairs_c2_2.log 2>&1; grep -E "wall|noise" $OUT/pairs_c2_2.log
