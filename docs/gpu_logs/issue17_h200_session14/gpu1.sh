# call 1: the GPU tests of kernel_eval at 918bbdf (the review's reshuffle: the CUDA probe fork only
# in the zygote that sees CUDA); then two 32-candidate batches at the default build count, which
# no earlier run used by itself (session 13's 7-build runs named --max-parallel-compiles 7)
set -x
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv
python -c "import kernel_eval as k; print('default builds at once on cuda:', k.default_parallel_compiles('cuda', k.EvalConfig()))"
timeout 300 python -m pytest -m gpu -v -rs --durations=10 tests/test_kernel_eval.py > $OUT/pytest_kernel_eval_gpu.log 2>&1; tail -15 $OUT/pytest_kernel_eval_gpu.log
for i in 1 2; do
  timeout 140 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --cache-root /tmp/d$i --json-out $OUT/default_$i.json > $OUT/default_$i.log 2>&1
  grep -E "wall|noise|per phase|^\|" $OUT/default_$i.log | tail -16
done
