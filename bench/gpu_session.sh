#!/usr/bin/env bash
# One device-machine session: run the named parts with time caps, keep going past failures, and
# pack logs + bench/results into $OUT/results.tgz (the device tool brings back few files).
#   bench/gpu_session.sh setup kernels e2e ...
# Parts: setup kernels extract-test extract-bench extract-bench-deep shard-writer train-bench scale e2e specforge drafter-ddp
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_DISABLE_PROGRESS_BARS=1
ATTENTION=${ATTENTION:-auto}

part() {  # part NAME CAP_SECONDS CMD...
  local name=$1 cap=$2; shift 2
  local t0=$(date +%s)
  timeout --kill-after=10 "$cap" "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc secs=$(( $(date +%s) - t0 ))" | tee -a "$OUT/summary.txt"
  tail -n 5 "$OUT/logs/$name.log" | sed "s/^/  $name| /"
  return $rc
}

for p in "$@"; do
  case $p in
    setup)
      part setup 120 bash -c 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && nvidia-smi --query-gpu=index,name,memory.total --format=csv && python3 -c "import torch, transformers, pydantic; print(torch.__version__, transformers.__version__, pydantic.__version__, torch.cuda.device_count())"' ;;
    kernels)
      part kernels 170 python3 tests/gpu/test_drafter_gpu.py --quick --stage kernels || ATTENTION=chunked ;;
    extract-test)
      part extract-test 150 python3 tests/gpu/test_extraction_gpu.py --quick ;;
    extract-bench)
      part extract-bench 120 python3 bench/bench_extract.py --quick ;;
    extract-test-bf16)
      part extract-test-bf16 150 python3 tests/gpu/test_extraction_gpu.py --quick --dtype bf16 --report bench/results/extract-gpu-check-bf16.json ;;
    shard-writer)
      part shard-writer 120 python3 bench/bench_shard_writer.py --gb 8 --out bench/results/shard_writer-gpu-box.json ;;
    extract-bench-deep)
      part extract-bench-deep 150 python3 bench/bench_extract.py --preset deep --out bench/results/extract-deep.json ;;
    extract-bench-wide)
      part extract-bench-wide 150 python3 bench/bench_extract.py --quick --preset wide --out bench/results/extract-wide.json ;;
    train-bench)
      part train-bench 240 python3 bench/bench_train.py --quick ;;
    scale)
      part scale 240 python3 bench/bench_scale.py --ranks 1,2 --quick ;;
    e2e)
      part e2e "${E2E_CAP:-540}" env NPROC=2 bench/gpu_e2e.sh --set draft_attention="$ATTENTION" ;;
    specforge)
      part specforge 480 python3 bench/bench_specforge.py --quick --part throughput ;;
    drafter-ddp)
      part drafter-ddp 200 python3 tests/gpu/test_drafter_gpu.py --quick --stage ddp --work /tmp/dgpu ;;
    *) echo "unknown part $p" ;;
  esac
done
# logs are committed: the checkout's absolute path says nothing to a reader of another machine
sed -i "s#$PWD/##g" "$OUT"/logs/*.log 2>/dev/null
tar czf "$OUT/results.tgz" bench/results "$OUT/logs" "$OUT/summary.txt" 2>/dev/null
ls -la "$OUT"
