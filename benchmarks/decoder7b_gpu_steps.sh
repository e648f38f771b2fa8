#!/usr/bin/env bash
# Issue 75's 7B-architecture measurements on the device tool's GPU machine, one step a call (each under the
# tool's 600 s), after the recipe of ../shared/gpu/README.md:
#   source .gpu/setup-on-gpu.sh; PRESET=7b FAULT=attention bash benchmarks/decoder7b_gpu_steps.sh STEP
# STEP:
#   gen        write the planted decoder (benchmarks/planted_decoder.py: PRESET 7b, 2b, 0.5b; FAULT attention or
#              norm) to $WORK unless it is there; prints the disk and memory left
#   run        the precision search (CUDA-EP verdicts at rel L2 0.05), stopped with Ctrl-C's signal at LIMIT
#              seconds (its replay kept), under /usr/bin/time -v (host peak RSS); EXTRA adds keys
#   resume     the same, resumed from the last run's replay (replay.load=)
#   layerwise  mode=layerwise on the same model and inputs
# The model, the run directories, the answer and the weight folder (TMPDIR) sit on one file system under $WORK's
# parent, so the run reads the model's data file where it is (a hard link) instead of copying 30 GB.
set -uo pipefail
PRESET=${PRESET:-7b}
FAULT=${FAULT:-attention}
BASE=${BASE:-$PWD/gpu_work}
WORK=${WORK:-$BASE/$PRESET-$FAULT}
OUT=${OUT:-./gpu_out}
LIMIT=${LIMIT:-540}
EXTRA=${EXTRA:-}
export TMPDIR=$BASE/tmp
mkdir -p "$OUT" "$TMPDIR" "$WORK"
run=(python3 -m runner "model=$WORK/decoder.onnx" "inputs=$WORK/ids.npz" checker=compare
  "checker.providers=[CUDAExecutionProvider]" checker.check_error_stat=rel_l2 checker.rtol=0.05)
keep() {  # copy a run's summary and log to $OUT, named by the step
  cp "$WORK/$1/summary.json" "$OUT/$PRESET-$FAULT-$1-summary.json" 2>/dev/null
  cp "$WORK/$1/runner.log" "$OUT/$PRESET-$FAULT-$1-runner.log" 2>/dev/null
  python3 -c "import json; s = json.load(open('$OUT/$PRESET-$FAULT-$1-summary.json')); print({k: s.get(k) for k in ('status', 'checks', 'check_s', 'kept', 'total', 'minimal', 'first_pass', 'wall_s', 'first_divergence')})"
}
case "${1:-}" in
  gen)
    [ -f "$WORK/decoder.onnx" ] || /usr/bin/time -f "generated in %e s, peak RSS %M KB" \
      python3 benchmarks/planted_decoder.py "$WORK" --preset "$PRESET" --fault "$FAULT" 2>&1 | tail -4
    ls -la "$WORK"; df -h "$BASE" /dev/shm | cat; free -g; nvidia-smi --query-gpu=name,memory.total --format=csv ;;
  run | resume)
    extra=(mode=precision marker=minimal "output=$WORK/mixed.onnx" overwrite=true)
    dir=$1
    if [ "$1" = resume ]; then  # from a copy of the last run's replay, in a new run directory
      last=$(ls -d "$WORK"/run "$WORK"/resume* 2>/dev/null | tail -1)
      cp "$last/replay.json" "$WORK/replay_$(basename "$last").json"
      extra+=("replay.load=$WORK/replay_$(basename "$last").json")
      dir=resume$(ls -d "$WORK"/resume* 2>/dev/null | wc -l)
    fi
    # shellcheck disable=SC2086
    timeout -s INT "$LIMIT" /usr/bin/time -f "wall %e s, host peak RSS %M KB" "${run[@]}" "${extra[@]}" $EXTRA \
      "hydra.run.dir=$WORK/$dir" 2>&1 | grep -v "Iteration\|precision:" | cut -c1-260 | tail -40
    keep "$dir"; df -h "$BASE" | tail -1 ;;
  layerwise)
    timeout -s INT "$LIMIT" /usr/bin/time -f "wall %e s, host peak RSS %M KB" "${run[@]}" mode=layerwise \
      "hydra.run.dir=$WORK/layerwise" 2>&1 | cut -c1-260 | tail -25
    keep layerwise ;;
  *) echo "usage: bash benchmarks/decoder7b_gpu_steps.sh gen|run|resume|layerwise" >&2; exit 2 ;;
esac
