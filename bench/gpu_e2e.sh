#!/usr/bin/env bash
# The GPU end-to-end run (issue 8): runbooks/demo.yaml through the runbook engine on the local
# transport, sized for 1-2 H200s: a tiny DeepseekV3 trained for a few minutes, chat data it
# regenerates itself, extraction and drafter training on $NPROC ranks, export, evaluation.
#   NPROC=2 bench/gpu_e2e.sh [extra --set ...]       -> bench/results/gpu-e2e.json
#   (one GPU: NPROC=1; run: carry [".whl/e2e"] after bench/stage_e2e.sh; E2E_OUT=$OUT/gpu-e2e.json)
set -u
cd "$(dirname "$0")/.."
STATE=${STATE:-/tmp/eagle3-gpu-e2e}
NPROC=${NPROC:-2}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# the device image has torch and transformers but not eagle-tui's own deps (pydantic, yaml, rich,
# textual, asyncssh): bench/stage_sglang.sh's site (carry .whl) goes at the END of sys.path, so
# the image's packages win; runbook steps say `python`, which the image may not have
# (bench/stage_e2e.sh's .whl/e2e: those deps alone, ~10 MB, plus the sglang 0.5.23 wheel the demo's
# fetch-sglang-source step reads, since the device cannot reach PyPI; or the SGLang site)
SITE=${SITE:-/tmp/site}
TARBALL=.whl/e2e/site.tar.xz; [ -f $TARBALL ] || TARBALL=.whl/sgl/site.tar.xz
if ! python3 -c "import eagle_tui.cli" 2>/dev/null && [ -f $TARBALL ]; then
  [ -d "$SITE/pydantic" ] || { mkdir -p "$SITE" && tar xJf $TARBALL -C "$SITE"; }
  mkdir -p /tmp/e2e-site && echo "import sys; sys.path.append('$SITE')" > /tmp/e2e-site/sitecustomize.py
  export PYTHONPATH="/tmp/e2e-site:$PYTHONPATH"
fi
if ls .whl/e2e/wheels/sglang-*.whl >/dev/null 2>&1; then  # where fetch-pristine looks first
  mkdir -p .cache/wheels
  for w in .whl/e2e/wheels/sglang-*.whl; do [ -e ".cache/wheels/${w##*/}" ] || cp "$w" .cache/wheels/; done
fi
command -v python >/dev/null || { mkdir -p /tmp/bin && ln -sf "$(command -v python3)" /tmp/bin/python && export PATH=/tmp/bin:$PATH; }
python3 -m eagle_tui.cli run runbooks/demo.yaml --auto --yes --quiet --state-dir "$STATE" \
  --set preset=gpu --set device=cuda --set nproc="$NPROC" \
  --set target_steps="${TARGET_STEPS:-400}" --set target_batch=16 --set seq_len=512 \
  --set per_source=300 --set prompts="${PROMPTS:-600}" --set new_tokens=128 --set regen_batch=300 \
  --set max_len=1024 --set draft_vocab=8192 --set token_budget=65536 \
  --set drafter_config=tiny-gpu \
  --set draft_steps="${DRAFT_STEPS:-300}" --set eval_prompts=16 --set eval_tokens=128 "$@"
code=$?
python3 bench/e2e_report.py --state-dir "$STATE" --out "${E2E_OUT:-bench/results/gpu-e2e.json}"
exit $code
