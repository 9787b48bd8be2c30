#!/usr/bin/env bash
# Issue 27's recorded trainer run on one GPU in ONE device call (at most TOTAL_S seconds, 530 by
# default: the run tool allows 600 with the machine's start outside it):
#   1. bench_long_context (LC_S seconds): 4K equal work (the trainer's defaults first, SpecForge
#      0.2.0, the lean set, the plain unroll; children side by side, each timing with the GPU
#      alone), then max_seq with the defaults (long batches in query shards): 16K timed, 131,072,
#      32K timed, probes while time is left; the shard size from the card's memory (16K on an
#      H200, 8K on an H100: bench_long_context.ladder_for), so an H100 still records valid figures
#   2. the chat bench in the time left (ours = the defaults, ours_equal_tokens, SpecForge; the
#      workers side by side). A parent cut by its limit after its workers wrote their records
#      is assembled from them (bench_specforge.py --assemble).
# Needs the SpecForge wheel in .whl/ (bash bench/stage_long_context.sh here; carry .whl).
#   OUT=DIR TOTAL_S=530 bash bench/gpu_trainer_run.sh    (results and logs under DIR)
# CPU rehearsal of the whole script with tiny shapes (TINY=1: --tiny / --device cpu, a few
# minutes): OUT=/tmp/gtr TINY=1 LC_S=300 TOTAL_S=520 bash bench/gpu_trainer_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/run}
TOTAL=${TOTAL_S:-530}
LC_S=${LC_S:-325}
PY=${PYTHON:-python3}
mkdir -p "$OUT/logs"
# fewer allocator splits near the card's capacity (the longest-sequence rungs)
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
lc_extra=() chat_extra=()
if [ "${TINY:-0}" = 1 ]; then
  lc_extra=(--tiny) chat_extra=(--device cpu --quick)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
t0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no GPU"; } \
  >"$OUT/logs/gpu.txt" 2>&1
echo "gpu_trainer_run: $(head -1 "$OUT/logs/gpu.txt")"
timeout -k 5 $((LC_S + 15)) "$PY" bench/bench_long_context.py --part equal --part maxseq \
  --budget-s "$LC_S" --equal-share "${EQUAL_SHARE:-0.47}" --sf-maxseq-share 0 --bisect 0 \
  ${FIRST_SEQ:+--first-seq "$FIRST_SEQ"} ${LADDER:+--ours-ladder "$LADDER"} "${lc_extra[@]}" \
  --work "$OUT/lc-work" --out "$OUT/long-context.json" >"$OUT/logs/long-context.log" 2>&1
echo "gpu_trainer_run: long-context rc=$? at $(($(date +%s) - t0)) s"
# children past the timeout (their own sessions) must not hold the GPU: their listed groups
for g in $(cat "$OUT/lc-work/pgids" 2>/dev/null); do kill -9 -- "-$g" 2>/dev/null; done
left=$((TOTAL - ($(date +%s) - t0) - 10))
timeout -k 5 "$left" "$PY" bench/bench_specforge.py --part throughput --workload chat \
  --no-noskip --side-by-side --work "$OUT/chat-work" --out "$OUT/specforge-chat.json" \
  "${chat_extra[@]}" >"$OUT/logs/specforge-chat.log" 2>&1
echo "gpu_trainer_run: chat rc=$? at $(($(date +%s) - t0)) s (limit ${left} s)"
# workers past the timeout (their own sessions) must not hold the GPU: their listed groups
for g in $(cat "$OUT/chat-work/pgids" 2>/dev/null); do kill -9 -- "-$g" 2>/dev/null; done
if [ ! -s "$OUT/specforge-chat.json" ]; then
  "$PY" bench/bench_specforge.py --assemble --workload chat --work "$OUT/chat-work" \
    --out "$OUT/specforge-chat.json" "${chat_extra[@]}" >>"$OUT/logs/specforge-chat.log" 2>&1
  echo "gpu_trainer_run: chat assembled from the workers' records rc=$?"
fi
grep -h "^long-context \[" "$OUT/logs/long-context.log"
grep -h "^bench_specforge \[" "$OUT/logs/specforge-chat.log"
echo "gpu_trainer_run: done at $(($(date +%s) - t0)) s"
