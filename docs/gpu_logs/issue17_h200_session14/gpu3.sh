# call 3: the GPU tests of the other modules with this code (the oracle CUDA rollout through
# forked run workers, the built-in problems' checker on CUDA, train, grpo, summarize, engines)
set -x
timeout 560 python -m pytest -m gpu -v -rs --durations=15 tests/test_tasks.py tests/test_rollout.py tests/test_train.py tests/test_grpo.py tests/test_summarize.py tests/test_engines.py tests/test_decode_attention.py > $OUT/pytest_gpu_others.log 2>&1; tail -40 $OUT/pytest_gpu_others.log
