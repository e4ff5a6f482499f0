#!/usr/bin/env bash
# Issue 13's H200 run: train.py under torchrun on a randomly initialised Qwen2-1.5B-shaped model
# with CUDA kernels (oracle-mixed): step 1, a checkpoint, then --resume for step 2; the step-time
# split and the training phase's MFU from metrics.jsonl.
#   bash bench/h200_train.sh run       # the train.py run (TURNS=1 by default; STEP_LIMIT s per torchrun;
#                                      # EXTRA="--compile" adds flags; NPROC=2 on two GPUs, issue 19:
#                                      # each rank evaluates its own tasks on its own GPU)
#   bash bench/h200_train.sh mfu       # bench/train_step.py's MFU table (~3 min)
# Logs go to $OUT (the device tool's output folder), or ./h200_out.
set -u
OUT=${OUT:-h200_out}
MODEL=/tmp/qwen2_1p5b
NPROC=${NPROC:-1}
RUN=/tmp/run_h200_${NPROC}gpu
N=_n$NPROC   # log names: one GPU's and two GPUs' runs side by side in one $OUT
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
[ -d $MODEL ] || python bench/train_step.py --make-model $MODEL > "$OUT/make_model.log" 2>&1 || { tail "$OUT/make_model.log"; exit 1; }
case "${1:-run}" in
run)
  COMMON="--device cuda --model $MODEL --task-ids builtin/level1/01_relu,builtin/level1/07_row_sum,builtin/level1/08_max_over_dim,builtin/level2/06_bias_tanh_multiply
          --tasks-per-step 4 --trajectories 4 --turns ${TURNS:-1} --max-new-tokens 768 --oracle-share 0.5
          --micro-batch-tokens 32768 --keep-checkpoints 1 --out $RUN ${EXTRA:-}"
  timeout ${STEP_LIMIT:-280} torchrun --standalone --nproc_per_node=$NPROC train.py $COMMON --steps 1 > "$OUT/train_step1$N.log" 2>&1
  echo "step 1 exit $?" >> "$OUT/train_step1$N.log"
  ls -la $RUN $RUN/checkpoints >> "$OUT/train_step1$N.log" 2>&1
  timeout ${STEP_LIMIT:-280} torchrun --standalone --nproc_per_node=$NPROC train.py $COMMON --steps 2 --resume > "$OUT/train_resume$N.log" 2>&1
  echo "resume exit $?" >> "$OUT/train_resume$N.log"
  cp $RUN/metrics.jsonl "$OUT/metrics$N.jsonl" 2>/dev/null
  cp $RUN/config.json "$OUT/config$N.json" 2>/dev/null
  cp $RUN/plots/curves.png "$OUT/curves$N.png" 2>/dev/null
  ls -la $RUN/export >> "$OUT/train_resume$N.log" 2>&1
  python bench/train_step.py --from-run $RUN --model $MODEL > "$OUT/split$N.md" 2>&1
  cat "$OUT/split$N.md"; tail -3 "$OUT/train_step1$N.log" "$OUT/train_resume$N.log"
  ;;
mfu)
  timeout ${MFU_LIMIT:-400} python bench/train_step.py --model $MODEL --rows 64 --prompt 1024 --completion 1024 \
      --budgets ${BUDGETS:-16384,32768} --checkpointing ${CKPT:-off,on} --repeats ${REPEATS:-2} --compile ${COMPILE:-off} 2>&1 | grep -v "Loading weights" > "$OUT/mfu.md"
  cat "$OUT/mfu.md"
  ;;
esac
