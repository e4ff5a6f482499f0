# call 1 (at d2dbf57): the GPU tests of kernel_eval, which run session 14's cap in paired_verdict
# on CUDA for the first time; the context-churn experiment (does another process's CUDA context
# creation and teardown move a short kernel's timed calls?); two 32-candidate batches at the
# default, for this session's side-by-side figures
set -x
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv
timeout 290 python -m pytest -m gpu -v -rs --durations=10 tests/test_kernel_eval.py > $OUT/pytest_kernel_eval_gpu.log 2>&1; tail -8 $OUT/pytest_kernel_eval_gpu.log
timeout 100 python docs/gpu_logs/issue17_h200_session15/context_churn.py 2>&1 | tee $OUT/context_churn.log
for i in 1 2; do
  timeout 120 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --cache-root /tmp/d$i --json-out $OUT/default_$i.json > $OUT/default_$i.log 2>&1
  grep -E "wall|noise|per phase|^\|" $OUT/default_$i.log | tail -16
done
