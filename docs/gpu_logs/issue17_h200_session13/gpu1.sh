# call 1 (the second try: the first found torch.utils.cpp_extension's import asks CUDA for
# devices, so no fork of a zygote that imported it could use CUDA): run workers forked from a run zygote (the new default) against spawned run workers
# (--no-run-zygote: the code before this session, with the op recorder change 942c6dd), each run
# cold, at the default 4 builds at once, under bench/cpu_by_process.py; the first beside the
# KernelBench-style baseline in the same run
set -x
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv
python docs/gpu_logs/issue17_h200_session13/zygote_probe.py 2>&1 | tee $OUT/zygote_probe.log
timeout 280 python bench/cpu_by_process.py -- python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 12 --baseline-n 0 --stability-runs 0 --cache-root /tmp/f1 --json-out $OUT/forked.json > $OUT/forked.log 2>&1; grep -E "wall|noise|KernelBench-style:|ratio|per phase|^\|" $OUT/forked.log | tail -40
timeout 200 python bench/cpu_by_process.py -- python bench/harness.py --device cuda --n-candidates 32 --kernelbench-n 0 --baseline-n 0 --stability-runs 0 --no-run-zygote --cache-root /tmp/s1 --json-out $OUT/spawned.json > $OUT/spawned.log 2>&1; grep -E "wall|noise|ratio|per phase|^\|" $OUT/spawned.log | tail -30
