#!/usr/bin/env bash
# Stage a real SGLang 0.5.14 for the GPU machine (python 3.12, torch 2.11+cu130, no network) into
# .whl/sgl/site.tar.xz (git-ignored, ~55 MB: fits one device call's 64 MiB carry beside the tree).
# Run here, where PyPI is reachable. On the GPU machine, bench/gpu_sglang.sh unpacks it into a
# directory appended to the END of sys.path, so every package the image already has wins and only
# what it lacks (sglang, its kernel, the serving stack) comes from here.
#  - sglang-kernel 0.4.4 is 615 MB; 1.76 GB unpacked is flash_ops.abi3.so (FA3, only for the fa3
#    attention backend) and sm100/ (Blackwell): both left out, the server runs --attention-backend triton.
#  - flashinfer's data/ (csrc, include, cutlass, cccl, spdlog) travels: flashinfer compiles its
#    kernels on first use with the machine's nvcc (RMSNorm through sgl_kernel, DeepSeek's fused
#    top-k routing), and without those sources the scheduler died at its first batch (2026-12-02).
#    bench/gpu_sglang.sh builds the two modules in the background while the target trains.
set -euo pipefail
cd "$(dirname "$0")/.."
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
source bench/stage_common.sh  # PLAT: the GPU machine's python 3.12
pip download -q --no-deps sglang==0.5.14 sglang-kernel==0.4.4 -d "$W/top"
# what the import chain of sglang.launch_server + models.deepseek_v2 needs beyond the image
# (found by probing; see ../shared/reference/sglang-on-gpu-machine.md), plus eagle-tui's own deps
pip download -q "${PLAT[@]}" -d "$W/deps" \
  fastapi starlette uvicorn orjson pyzmq msgspec setproctitle pybase64 interegular partial_json_parser \
  python-multipart compressed-tensors loguru openai==2.6.1 jiter sniffio distro pydantic pydantic-core \
  annotated-types typing-inspection annotated-doc apache-tvm-ffi==0.1.9 cuda-tile flashinfer-python==0.6.12 \
  torchao==0.17.0 blobfile==3.0.0 lxml pycryptodomex easydict gguf dill opentelemetry-api \
  'torch_memory_saver>=0.0.9.post1' anyio h11 httpx httpcore click psutil urllib3 einops nvidia-ml-py \
  tabulate ninja prometheus-client tiktoken regex requests charset-normalizer idna certifi \
  textual==8.2.8 asyncssh==2.24.1 textual-plotext plotext rich markdown-it-py mdurl mdit-py-plugins \
  linkify-it-py uc-micro-py pygments cryptography cffi platformdirs pyyaml
mkdir -p "$W/site"
for w in "$W"/deps/*.whl "$W"/top/*.whl; do unzip -q -o "$w" -d "$W/site"; done
rm -rf "$W"/site/sgl_kernel/flash_ops.abi3.so "$W"/site/sgl_kernel/sm100
mkdir -p .whl/sgl
tar cf - -C "$W/site" . | xz -T0 -6 > .whl/sgl/site.tar.xz
ls -la .whl/sgl/site.tar.xz
