# Third call of session 17 (ran): the GPU tests of every other module, on d41c8e6
mkdir -p $OUT; timeout 480 python -m pytest -q -m gpu --durations=10 tests --deselect tests/test_kernel_eval.py 2>&1 | tee $OUT/pytest_gpu_other.log | tail -25
