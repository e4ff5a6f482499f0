#!/usr/bin/env bash
# Issue 16's H200 run (one GPU, about 6 minutes, at most 500 s): the GPU tests of engines.py (the fast decoder in
# bf16 and fp32, graph == eager == generate, FSDP2 on one rank, an oracle-free rollout), then
# bench/generation.py on Qwen2-1.5B's shape at batch 64 and 256: the fast decoder beside plain
# generate (static and dynamic cache) and the old HFEngine path. Two bench runs, so a failure
# in the second cannot lose the first's rows.
#   bash bench/h200_generation.sh      # logs to $OUT (the device tool's output folder), or ./h200_out
set -u
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
timeout ${TEST_LIMIT:-80} python -m pytest -q -m gpu -p no:cacheprovider -k "not oracle_rollout_on_real_kernels" \
  tests/test_engines.py tests/test_rollout.py \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests exit $?" >> "$OUT/gpu_tests.log"
BENCH="python bench/generation.py --shape qwen2-1.5b --batches 64,256 --prompt 512 --new 256 --split"
timeout ${BENCH_LIMIT:-90} $BENCH --rows hf_fast > "$OUT/bench_fast.md" 2>&1
echo "bench exit $?" >> "$OUT/bench_fast.md"
# static-cache generate compiles its forward on first use (over 90 s on the H200: it was cut there
# once), so it runs alone, with room; the ratio is hf_fast over this row
timeout ${STATIC_LIMIT:-240} $BENCH --rows generate_static > "$OUT/bench_static.md" 2>&1
echo "bench exit $?" >> "$OUT/bench_static.md"
timeout ${BENCH_REST_LIMIT:-90} $BENCH --rows hf_fast_fsdp2,generate_dynamic,hf_plain > "$OUT/bench_rest.md" 2>&1
echo "bench exit $?" >> "$OUT/bench_rest.md"
tail -5 "$OUT/gpu_tests.log"; grep -v "generation flags" "$OUT/bench_fast.md" | tail -8; grep -v "generation flags" "$OUT/bench_static.md" | tail -4; grep -v "generation flags" "$OUT/bench_rest.md" | tail -8
