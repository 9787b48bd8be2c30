#!/usr/bin/env bash
# Issue 26 on one H200: the whole real-SGLang 0.5.14 check through Kimi-K2.5's own wrapper class
# (runbooks/gpu-sglang-check-kimi.yaml: tiny KimiK25ForConditionalGeneration + tiktoken remote-code
# tokenizer, final-state check, Llama and MLA drafters) -> $OUT/sglang-kimi-k25.json + bundle.tgz,
# and issue 30's online bench on the same extraction server (step online-bench) -> $OUT/online.json.
# Same staging, budget, RESUME=1 and per-step fallback as bench/gpu_sglang.sh (which this runs):
#   run: carry [".whl"], command: bash bench/gpu_sglang_kimi.sh
#   a call cut by the device's 10 minutes: RESUME=1 bash bench/gpu_sglang_kimi.sh on the warm machine
#   SIZES=quick: a smoke run (tiny sizes: acceptance then means nothing)
set -u
cd "$(dirname "$0")/.."
if [ "${SIZES:-}" = quick ]; then
  EXTRA_SETS="${EXTRA_SETS:-} target_steps=20 per_source=48 prompts=16 draft_steps=20 accept_n=6 accept_tokens=32 min_final_agreement=0"
fi
export EXTRA_SETS="${EXTRA_SETS:-}" SIZES=""
RUNBOOK=runbooks/gpu-sglang-check-kimi.yaml REPORT=sglang-kimi-k25.json REPORT_FLAVOURS=llama,mla \
  KEEP_FILES="${KEEP_FILES:-online.json}" exec bash bench/gpu_sglang.sh
