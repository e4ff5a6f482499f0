#!/usr/bin/env bash
# Issue 16's H200 runs (one GPU), in parts, each a separate process so a failure cannot lose another's rows:
#   tests     the GPU tests of engines.py and rollout.py (the fast decoder in bf16 and fp32, graph ==
#             compiled graph == eager == generate, FSDP2 on one rank, an oracle-free rollout)   <= 80 s
#   fast      bench/generation.py, the fast decoder (hf_fast)                                   <= 90 s
#   compiled  the same with its step compiled (hf_fast_compiled; the warm-up call compiles)     <= 300 s
#   static    plain generate with a static cache (compiles on first use: the ratio)    <= 240 s
#   rest      the fast decoder on FSDP2, plain generate (dynamic cache), the old HFEngine path  <= 90 s
# Qwen2-1.5B's shape, batch 64 and 256, 512-token prompts, 256 new tokens, with the decode-only split.
#   bash bench/h200_generation.sh                           # every part: ~800 s, two device calls' worth
#   bash bench/h200_generation.sh tests fast compiled       # one call (~190 s on 2026-12-02)
#   STATIC_LIMIT=450 bash bench/h200_generation.sh static   # its own call: static generate's compile
#                                                           # outran 90 s and ~140 s in two calls
# Logs go to $OUT (the device tool's output folder), or ./h200_out.
set -u
OUT=${OUT:-h200_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
BENCH="python bench/generation.py --shape qwen2-1.5b --batches 64,256 --prompt 512 --new 256 --split"
bench() {  # bench PART LIMIT ROWS
  timeout "$2" $BENCH --rows "$3" > "$OUT/bench_$1.md" 2>&1
  echo "bench exit $?" >> "$OUT/bench_$1.md"
  grep -v "generation flags" "$OUT/bench_$1.md" | grep "|\|exit"
}
for part in "${@:-tests fast compiled static rest}"; do
  for p in $part; do
    case "$p" in
      tests)
        timeout ${TEST_LIMIT:-80} python -m pytest -q -m gpu -p no:cacheprovider -k "not oracle_rollout_on_real_kernels" \
          tests/test_engines.py tests/test_rollout.py > "$OUT/gpu_tests.log" 2>&1
        echo "gpu tests exit $?" >> "$OUT/gpu_tests.log"; tail -3 "$OUT/gpu_tests.log" ;;
      fast) bench fast ${BENCH_LIMIT:-90} hf_fast ;;
      compiled) bench compiled ${COMPILED_LIMIT:-300} hf_fast_compiled ;;
      static) bench static ${STATIC_LIMIT:-240} generate_static ;;
      rest) bench rest ${BENCH_REST_LIMIT:-90} hf_fast_fsdp2,generate_dynamic,hf_plain ;;
      *) echo "unknown part $p (tests | fast | compiled | static | rest)"; exit 2 ;;
    esac
  done
done
