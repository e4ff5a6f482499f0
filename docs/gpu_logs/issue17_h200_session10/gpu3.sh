# call 3: kernel_eval's GPU tests with timing_cpus=2 the default; grpo's GPU tests; a one-step CUDA
# train.py smoke (grpo.completion_logprobs and the rank's CPU binding on CUDA); then pair noise, no kept CPUs
set -x
timeout 220 python -m pytest -m gpu -q tests/test_kernel_eval.py -k "not builtin" > $OUT/ke_gpu.log 2>&1; tail -3 $OUT/ke_gpu.log
timeout 40 python -m pytest -m gpu -q tests/test_grpo.py > $OUT/grpo_gpu.log 2>&1; tail -2 $OUT/grpo_gpu.log
timeout 150 python train.py --device cuda --steps 1 --turns 1 --trajectories 2 --out $OUT/smoke > $OUT/train_smoke.log 2>&1; echo rc=$?; tail -c 600 $OUT/train_smoke.log
timeout 160 python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --timing-cpus 0 --json-out $OUT/pairs_c0_2.json > $OUT/pairs_c0_2.log 2>&1; grep -E "wall|noise" $OUT/pairs_c0_2.log
