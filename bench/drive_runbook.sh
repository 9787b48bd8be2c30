# Sourced by bench/gpu_sglang.sh: drive one runbook run through the engine inside a device call's
# budget, and on a later call (RESUMING) carry the same run on until no step is left that can run.
# Needs: RB (runbook), STATE (state dir), OUT (logs), END (epoch seconds the engine must stop by),
# SETS (array of --set args), RESUMING (non-empty on a resumed call), CHECK (gpu_sglang_check.py).
# Sets RBRC: the first engine run's exit code (124: the budget ran out).

run_rb() {  # run_rb [--run latest] [--only STEP]: the engine, bounded by what is left of the budget
  local left=$(( END - $(date +%s) ))
  [ $left -le 5 ] && { echo "no time left for $*" >> $OUT/runbook.log; return 124; }
  timeout -s TERM $left setsid python3 -m eagle_tui.cli run $RB \
    --auto --yes --quiet --state-dir $STATE "${SETS[@]}" "$@" >> $OUT/runbook.log 2>&1
}

drive_runbook() {
  if [ -n "${RESUMING:-}" ]; then run_rb --run latest; else run_rb; fi; RBRC=$?
  [ $RBRC -eq 124 ] && return
  # The engine stops at the first step that fails: run each step not yet tried on its own, so
  # whatever does not depend on the failure still runs (the engine still enforces `requires`).
  # Also after exit 0: a resumed run first follows the intent its cut driver saved, and a driver
  # cut inside this loop saved `--only STEP`, so it ends 0 with that one step done and the rest
  # pending (the Kimi run of 2026-12-07 lost a device call so).
  local tried="" next
  while :; do  # only steps whose requires all succeeded (each engine start costs seconds)
    python3 -m eagle_tui.cli status --state-dir $STATE --json > $OUT/state-now.json 2>/dev/null
    next=$(python3 $CHECK runnable --state $OUT/state-now.json --runbook $RB --tried "$tried" ${RESUMING:+--lost} | cut -d' ' -f1)
    [ -z "$next" ] && break
    tried="$tried $next"; echo "== --only $next" >> $OUT/runbook.log
    run_rb --run latest --only $next || [ $? -ne 124 ] || break
  done
}
