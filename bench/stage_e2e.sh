#!/usr/bin/env bash
# Stage what bench/gpu_e2e.sh needs on the GPU machine (python 3.12, no network) into .whl/e2e/
# (git-ignored, ~45 MB: one device call's carry): eagle-tui's own deps for the headless runbook
# engine (site.tar.xz, appended to the END of sys.path so the image's packages win) and the
# sglang 0.5.23 wheel whose pristine deepseek_v2.py the demo runbook patches (the
# fetch-sglang-source step reads it from the repo's .cache/wheels, checked against its RECORD and
# the hash table; without it that step needs PyPI, which the device cannot reach).
#   bash bench/stage_e2e.sh; then run: carry [".whl/e2e"], command: NPROC=1 bash bench/gpu_e2e.sh
set -euo pipefail
cd "$(dirname "$0")/.."
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
source bench/stage_common.sh  # PLAT: the GPU machine's python 3.12
pip download -q "${PLAT[@]}" -d "$W/deps" pydantic pydantic-core annotated-types typing-inspection \
  pyyaml rich markdown-it-py mdurl mdit-py-plugins linkify-it-py uc-micro-py pygments textual==8.2.8 \
  textual-plotext plotext asyncssh==2.24.1 cryptography cffi platformdirs tiktoken==0.14.0 regex
mkdir -p "$W/site" .whl/e2e/wheels
for w in "$W"/deps/*.whl; do unzip -q -o "$w" -d "$W/site"; done
tar cf - -C "$W/site" . | xz -T0 -6 > .whl/e2e/site.tar.xz
if ! ls .whl/e2e/wheels/sglang-0.5.23-*.whl >/dev/null 2>&1; then
  if ls .cache/wheels/sglang-0.5.23-*.whl >/dev/null 2>&1; then
    cp .cache/wheels/sglang-0.5.23-*.whl .whl/e2e/wheels/
  else
    pip download -q --no-deps sglang==0.5.23 -d .whl/e2e/wheels
  fi
fi
du -sh .whl/e2e; ls -la .whl/e2e .whl/e2e/wheels
