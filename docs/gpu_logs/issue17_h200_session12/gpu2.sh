# call 2: a candidate worker's boot, stage by stage; the GPU tests that build CUDA candidates through
# kernel_eval with this session's code (host PCH, slim CUDAContext; 4 builds at once the default
# again), the built-in solutions' test included
set -x
for i in 1 2 3; do python docs/gpu_logs/issue17_h200_session12/worker_boot.py; done 2>&1 | tee $OUT/worker_boot.log
timeout 540 python -m pytest -m gpu -v -rs --durations=15 tests/test_kernel_eval.py tests/test_tasks.py tests/test_train.py tests/test_rollout.py > $OUT/pytest_gpu.log 2>&1; tail -30 $OUT/pytest_gpu.log
