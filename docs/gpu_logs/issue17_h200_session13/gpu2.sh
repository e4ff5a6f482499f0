# call 2: the GPU tests of kernel_eval with this session's code: every CUDA candidate now runs in a
# worker forked from the run zygote (the adversarial suite, the built-in solutions, the slim tier);
# then the batch again at 7 builds at once, now that run workers leave the builds more CPU
set -x
timeout 330 python -m pytest -m gpu -v -rs --durations=10 tests/test_kernel_eval.py > $OUT/pytest_kernel_eval_gpu.log 2>&1; tail -15 $OUT/pytest_kernel_eval_gpu.log
timeout 170 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --max-parallel-compiles 7 --cache-root /tmp/f7 --json-out $OUT/forked_7builds.json > $OUT/forked_7builds.log 2>&1; grep -E "wall|noise|per phase|^\|" $OUT/forked_7builds.log | tail -20
# call 3 (the machine still warm): the 7-build batch again, beside the KernelBench-style baseline in the same run
timeout 270 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 12 --baseline-n 0 --stability-runs 0 --max-parallel-compiles 7 --cache-root /tmp/f7b --json-out $OUT/forked_7builds_with_baseline.json > $OUT/forked_7builds_with_baseline.log 2>&1; grep -E "wall|noise|KernelBench-style:|ratio|per phase|^\|" $OUT/forked_7builds_with_baseline.log | tail -25
