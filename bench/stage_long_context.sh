#!/usr/bin/env bash
# Stage what bench/bench_long_context.py needs on the GPU box that it cannot download there:
# the SpecForge 0.2.0 wheel (pure Python, ~0.5 MB), into the git-ignored .whl/. No dependencies:
# the bench puts the wheel zip on sys.path and imports only SpecForge's EAGLE-3 modules, whose
# imports (torch, transformers, safetensors, triton) the device image already has.
# Run here (PyPI access), then carry `.whl` to the device:
#   bash bench/stage_long_context.sh
#   run(command="python3 bench/bench_long_context.py", carry=[".whl"])
set -euo pipefail
cd "$(dirname "$0")/.."
WHEEL=.whl/specforge-0.2.0-py3-none-any.whl
# the sha256 bench/results/specforge-full.json recorded for the wheel measured last time
SHA=fbc79517adf483c6a8beea52561b1a8c8c8a99a54c820b47d2033a73966b55b0
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if [ ! -f "$WHEEL" ]; then
  "$PY" -m pip download --no-deps --only-binary=:all: -d .whl specforge==0.2.0
fi
got=$(sha256sum "$WHEEL" | cut -d' ' -f1)
if [ "$got" != "$SHA" ]; then
  echo "stage_long_context: $WHEEL sha256 $got, expected $SHA" >&2
  exit 1
fi
echo "stage_long_context: $WHEEL ($(du -h "$WHEEL" | cut -f1)) sha256 ok; carry .whl"
