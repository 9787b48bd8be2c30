#!/usr/bin/env bash
# Issue 30's online bench on its own, a FALLBACK: the Kimi check (bench/gpu_sglang_kimi.sh) runs
# it as its step online-bench on the extraction server (EAGLE3_DUMP_MODE=both), with no second
# server start. Use this only on the machine still warm from that script when online-bench did
# not succeed there: it starts the same patched SGLang 0.5.14 in mode both with a fresh dump dir,
# runs bench/bench_online.py (online from the stream vs offline from the server's dump of the
# same forwards), stops it and reverts the patch byte-exact. Needs what gpu_sglang_kimi.sh left:
# the staged site (/tmp/site), the stubs (/tmp/stubs), the tiny Kimi-K2.5 wrapper target, its
# merged dataset and the init drafter (/tmp/sglang-check). The server's first forwards compile
# kernels (~2 min on 2026-12-04), hence the bench's longer producer wait here.
#   run: command: BUDGET_S=450 bash bench/gpu_online_sglang.sh     -> $OUT/online.json
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
S=${SITE:-/tmp/site}; WORK=${WORK:-/tmp/sglang-check}; ST=${STUBS_DIR:-/tmp/stubs}; BIN=${BIN_DIR:-/tmp/bin}
T=$S/sglang/srt/models/deepseek_v2.py
PRISTINE=947fdc256101f538a668090f82e5eb5f888e2434f2bbbf69a99cdaa628cf902e
PORT=${PORT:-30007}; RUN=/tmp/online-run; END=$(( $(date +%s) + ${BUDGET_S:-450} ))
export PATH=$BIN:$PATH PYTHONPATH=$ST/site:$PWD PYTHONUNBUFFERED=1
LOG=$OUT/online-sglang.log; : > "$LOG"
say() { echo "== $* ($(date +%H:%M:%S))" | tee -a "$LOG"; }
for need in "$S/sglang/version.py" "$WORK/target/model/config.json" "$WORK/merged.jsonl" \
            "$WORK/init-drafter/config.json"; do
  [ -e "$need" ] || { say "missing $need: run bench/gpu_sglang_kimi.sh first on this machine"; exit 3; }
done
rm -rf $RUN; mkdir -p $RUN
say "patch apply"
python3 -m remote_agent.eagle3 patch apply --target $T --version 0.5.14 --json >> "$LOG" 2>&1
say "server (mode both)"
EAGLE3_DUMP_MODE=both EAGLE3_STREAM_ADDR=unix:$RUN/stream.sock setsid python3 -m remote_agent.eagle3 \
  sglang-launch extract --model $WORK/target/model --tp 1 --port $PORT --dump-dir $RUN/dump \
  --draft-model $WORK/init-drafter --sglang-version 0.5.14 \
  --arg=--attention-backend --arg=triton --arg=--grammar-backend --arg=none \
  --arg=--mem-fraction-static --arg=0.5 --arg=--mm-attention-backend --arg=triton_attn \
  > $OUT/online-server.log 2>&1 &
SRV=$!
up=""
while [ $(date +%s) -lt $(( END - 120 )) ]; do
  curl -sf http://127.0.0.1:$PORT/health > /dev/null 2>&1 && { up=1; break; }
  kill -0 $SRV 2>/dev/null || break
  sleep 3
done
RC=4
if [ -n "$up" ]; then
  say "bench"
  timeout $(( END - $(date +%s) - 15 )) python3 bench/bench_online.py --device cuda \
    --server http://127.0.0.1:$PORT --stream unix:$RUN/stream.sock --dump $RUN/dump \
    --dataset $WORK/merged.jsonl --target $WORK/target/model --work $RUN/bench \
    --samples ${ONLINE_SAMPLES:-48} --epochs ${ONLINE_EPOCHS:-2} --max-tokens 256 \
    --producer-wait-s 400 --out $OUT/online.json >> "$LOG" 2>&1
  RC=$?
else
  say "the server did not come up (see online-server.log)"
fi
say "bench rc=$RC; stop server"
kill -TERM -- -$SRV 2>/dev/null; sleep 5; kill -KILL -- -$SRV 2>/dev/null
python3 -m remote_agent.eagle3 patch revert --target $T --version 0.5.14 --json >> "$LOG" 2>&1
[ "$(sha256sum $T | cut -c1-64)" = $PRISTINE ] && say "revert byte-identical" || say "REVERT NOT PRISTINE"
cp -f $RUN/bench/*.log $OUT/ 2>/dev/null
tail -5 "$LOG"
exit $RC
