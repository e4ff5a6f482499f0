# call 2: the GPU tests with this session's code: every CUDA candidate now runs in a worker forked
# from the run zygote (the adversarial suite, the built-in solutions, the slim tier), then the
# oracle rollout on real CUDA kernels that session 12's call cut off
set -x
timeout 330 python -m pytest -m gpu -v -rs --durations=10 tests/test_kernel_eval.py > $OUT/pytest_kernel_eval_gpu.log 2>&1; tail -15 $OUT/pytest_kernel_eval_gpu.log
timeout 230 python -m pytest -m gpu -v -rs --durations=5 tests/test_rollout.py tests/test_tasks.py > $OUT/pytest_rollout_tasks_gpu.log 2>&1; tail -12 $OUT/pytest_rollout_tasks_gpu.log
