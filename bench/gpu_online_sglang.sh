#!/usr/bin/env bash
# Issue 30 on one H200: online training from a real SGLang 0.5.14 in stream mode vs offline
# training from that server's own dense dump, same samples, same order (bench/bench_online.py).
# Runs on the machine still warm from bench/gpu_sglang_kimi.sh, which left behind: the staged site
# (/tmp/site), the stubs (/tmp/stubs), the tiny Kimi-K2.5 wrapper target, its merged dataset, the
# init drafter and SGLang's dense dump of that dataset (/tmp/sglang-check). Here: re-apply the
# patch, start the server with EAGLE3_DUMP_MODE=stream, run the bench, stop it, revert byte-exact.
#   run: command: RESUME=1 bash bench/gpu_sglang_kimi.sh; BUDGET_S=250 bash bench/gpu_online_sglang.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
S=${SITE:-/tmp/site}; WORK=${WORK:-/tmp/sglang-check}; ST=${STUBS_DIR:-/tmp/stubs}; BIN=${BIN_DIR:-/tmp/bin}
T=$S/sglang/srt/models/deepseek_v2.py
PRISTINE=947fdc256101f538a668090f82e5eb5f888e2434f2bbbf69a99cdaa628cf902e
PORT=${PORT:-30007}; RUN=/tmp/online-run; END=$(( $(date +%s) + ${BUDGET_S:-250} ))
export PATH=$BIN:$PATH PYTHONPATH=$ST/site:$PWD PYTHONUNBUFFERED=1
LOG=$OUT/online-sglang.log; : > "$LOG"
say() { echo "== $* ($(date +%H:%M:%S))" | tee -a "$LOG"; }
for need in "$S/sglang/version.py" "$WORK/target/model/config.json" "$WORK/merged.jsonl" \
            "$WORK/init-drafter/config.json" "$WORK/sglang-dumps"; do
  [ -e "$need" ] || { say "missing $need: run bench/gpu_sglang_kimi.sh first on this machine"; exit 3; }
done
rm -rf $RUN; mkdir -p $RUN/control
say "patch apply"
python3 -m remote_agent.eagle3 patch apply --target $T --version 0.5.14 --json >> "$LOG" 2>&1
say "stream server"
EAGLE3_DUMP_MODE=stream EAGLE3_STREAM_ADDR=unix:$RUN/stream.sock setsid python3 -m remote_agent.eagle3 \
  sglang-launch extract --model $WORK/target/model --tp 1 --port $PORT --dump-dir $RUN/control \
  --draft-model $WORK/init-drafter --sglang-version 0.5.14 \
  --arg=--attention-backend --arg=triton --arg=--grammar-backend --arg=none \
  --arg=--mem-fraction-static --arg=0.5 --arg=--mm-attention-backend --arg=triton_attn \
  > $OUT/online-server.log 2>&1 &
SRV=$!
up=""
while [ $(date +%s) -lt $(( END - 60 )) ]; do
  curl -sf http://127.0.0.1:$PORT/health > /dev/null 2>&1 && { up=1; break; }
  kill -0 $SRV 2>/dev/null || break
  sleep 3
done
RC=4
if [ -n "$up" ]; then
  say "bench"
  timeout $(( END - $(date +%s) - 15 )) python3 bench/bench_online.py --device cuda \
    --server http://127.0.0.1:$PORT --stream unix:$RUN/stream.sock --dump $WORK/sglang-dumps \
    --dataset $WORK/merged.jsonl --target $WORK/target/model --work $RUN/bench \
    --out $OUT/online.json >> "$LOG" 2>&1
  RC=$?
else
  say "the stream server did not come up (see online-server.log)"
fi
say "bench rc=$RC; stop server"
kill -TERM -- -$SRV 2>/dev/null; sleep 5; kill -KILL -- -$SRV 2>/dev/null
python3 -m remote_agent.eagle3 patch revert --target $T --version 0.5.14 --json >> "$LOG" 2>&1
[ "$(sha256sum $T | cut -c1-64)" = $PRISTINE ] && say "revert byte-identical" || say "REVERT NOT PRISTINE"
cp -f $RUN/bench/*.log $OUT/ 2>/dev/null
tail -5 "$LOG"
exit $RC
