#!/usr/bin/env bash
# The 0.5B decoder's measurements on the device tool's GPU machine (issue 65), one step a call (each under the
# tool's 600 s), after the recipe of ../shared/gpu/README.md:
#   source .gpu/setup-on-gpu.sh; bash benchmarks/qwen_gpu_steps.sh STEP
# STEP:
#   phases   benchmarks/check_phases.py on 6 candidates keeping 10%, 50% and 90% in turn, and fp16's native
#            switched model (--switched): where one check's seconds go, and whether switched runs give its bits
#   full     the unbudgeted precision run at ONNX Runtime's level "all" (each candidate built)
#   disable  the same at level "disable" (candidates run as feeds of the native switched model)
#   budget   the same as full with budget.seconds=300
#   ahead    the same as full with executor=local executor.workers=1 (each candidate built while the check before runs)
#   profile  a run of 40 checks under cProfile: where a check's seconds go in a run (the calls under the check)
# The decoder (attention overflowing fp16 in every layer) is exported to $WORK first where it is not there
# (about 60 s; kept while the machine stays warm). Figures go to $OUT (the device tool's), else ./gpu_out.
# LIMIT (seconds, 520 by default) stops a run with Ctrl-C's signal: its replay and summary are kept. PROVIDER
# (CUDAExecutionProvider by default) is the checker's ONNX Runtime provider (CPUExecutionProvider tries the steps
# on any machine, with a WORK that holds a qwen2.onnx and its ids.npz).
set -uo pipefail
WORK=${WORK:-/tmp/qx}
OUT=${OUT:-./gpu_out}
LIMIT=${LIMIT:-520}
PROVIDER=${PROVIDER:-CUDAExecutionProvider}
case "${1:-}" in
  phases | full | disable | budget | ahead | profile) ;;
  *) echo "usage: bash benchmarks/qwen_gpu_steps.sh phases|full|disable|budget|ahead|profile" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
[ -f "$WORK/qwen2.onnx" ] || python3 benchmarks/qwen_on_gpu.py --export-only --work "$WORK" --fault attention | tail -1
run=(python3 -m runner mode=precision marker=minimal "model=$WORK/qwen2.onnx" "inputs=$WORK/ids.npz" checker=compare
  "checker.providers=[$PROVIDER]" checker.check_error_stat=rel_l2 checker.rtol=0.05)
keep() {  # copy a run's summary and log to $OUT, named by the step
  cp "$WORK/$1/summary.json" "$OUT/$1-summary.json" 2>/dev/null
  cp "$WORK/$1/runner.log" "$OUT/$1-runner.log" 2>/dev/null
  python3 -c "import json; s = json.load(open('$OUT/$1-summary.json')); print({k: s.get(k) for k in ('status', 'checks', 'check_s', 'switched_checks', 'kept', 'minimal', 'ranked_again', 'wall_s')})"
}
case "${1:-}" in
  phases)
    (cd benchmarks && python3 check_phases.py --model "$WORK/qwen2.onnx" --inputs "$WORK/ids.npz" --candidates 6 \
      --kept 0.1,0.5,0.9 --switched --provider "$PROVIDER") 2>&1 | tee "$OUT/phases.txt" | tail -30 ;;
  full | disable | budget | ahead)
    extra=()
    [ "$1" = disable ] && extra=(checker.graph_optimization_level=disable)
    [ "$1" = budget ] && extra=(budget.seconds=300)
    [ "$1" = ahead ] && extra=(executor=local executor.workers=1)
    timeout -s INT "$LIMIT" "${run[@]}" "${extra[@]}" "hydra.run.dir=$WORK/$1" "output=$WORK/$1.onnx" 2>&1 \
      | grep -v Iteration | tail -25
    keep "$1" ;;
  profile)
    timeout -s INT "$LIMIT" python3 -m cProfile -o "$OUT/run.prof" -m runner "${run[@]:3}" budget.checks=40 \
      "hydra.run.dir=$WORK/profile" "output=$WORK/profile.onnx" > "$WORK/profile.out" 2>&1
    keep profile
    python3 -c "
import pstats
p = pstats.Stats('$OUT/run.prof')
p.sort_stats('cumulative').print_callees(r'checker.py:\d+\(check\)')
p.print_callees(r'onnxruntime.py:\d+\(run\)')
p.sort_stats('tottime').print_stats(25)" 2>&1 | grep -v '^$' | cut -c1-180 | head -90 ;;
esac
