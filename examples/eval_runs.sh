#!/usr/bin/env bash
# eval.py's reference runs on one GPU (run from the repository root; results and logs go under
# $OUT/eval). Two parts, each under 10 minutes on an H200 (docs/eval/README.md has their results):
#   bash examples/eval_runs.sh oracle   # the oracle and the corrupted oracle over all 24 built-in CUDA solutions
#   bash examples/eval_runs.sh grid     # inference-time grid at 8 kernels per task, oracle with half its answers corrupted
# The same on the CPU at a small size (C++ kernels, a few minutes):
#   OUT=/tmp/small DEVICE=cpu SELECT="--task-ids builtin/level1/01_relu" GRID=2x1,1x2,beam:2x1x1 KEEP=1 bash examples/eval_runs.sh oracle grid
# Records are appended per turn, so a part cut by its timeout keeps what was judged; rerun it with
# RESUME=--resume to continue (the grid's beam shape starts again). The two parts may run at once
# (the harness times under a machine-wide file lock), but the builds of two harnesses then load the
# same cores and the timing cross-check refuses more honest kernels: run them one after the other.
set -u
OUT=${OUT:-runs}
DEVICE=${DEVICE:-cuda}
SELECT=${SELECT:-}
GRID=${GRID:-8x1,4x2,2x4,beam:4x1x2}
KEEP=${KEEP:-2}
GRID_SELECT=${GRID_SELECT:---split heldout --n-heldout 6}
RESUME=${RESUME:-}
ORACLE_LIMIT=${ORACLE_LIMIT:-280}   # seconds per policy
GRID_LIMIT=${GRID_LIMIT:-560}
mkdir -p "$OUT/eval"
for part in "$@"; do
  case "$part" in
    oracle)
      for policy in oracle oracle-corrupt; do
        timeout $ORACLE_LIMIT python eval.py --policy $policy --tasks builtin --device "$DEVICE" $SELECT \
          --trajectories 1 --turns 1 --out "$OUT/eval/${policy}_$DEVICE" --no-progress $RESUME \
          > "$OUT/eval/${policy}_$DEVICE.log" 2>&1
        echo "$policy: exit $? ($(wc -l < "$OUT/eval/${policy}_$DEVICE/records.jsonl") records)"
      done ;;
    grid)
      timeout $GRID_LIMIT python eval.py --policy oracle --corrupt-rate 0.5 --tasks builtin --device "$DEVICE" \
        ${SELECT:-$GRID_SELECT} --grid "$GRID" --beam-keep "$KEEP" --out "$OUT/eval/grid_$DEVICE" \
        --no-progress $RESUME > "$OUT/eval/grid_$DEVICE.log" 2>&1
      echo "grid: exit $?"; cat "$OUT/eval/grid_$DEVICE/grid.md" 2>/dev/null ;;
    *) echo "unknown part $part (oracle | grid)"; exit 2 ;;
  esac
done
