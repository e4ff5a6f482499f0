# call 2: every GPU test with this session's code (host PCH, slim CUDAContext, 4 builds at once the
# default again), the built-in tasks' test included
set -x
nvidia-smi --query-gpu=name,memory.used --format=csv
timeout 560 python -m pytest -m gpu -q -rs tests/ > $OUT/pytest_gpu_all.log 2>&1; tail -15 $OUT/pytest_gpu_all.log
