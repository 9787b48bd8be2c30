#!/usr/bin/env bash
# A real SGLang 0.5.14 on one H200, the whole issue-16 path (runbooks/gpu-sglang-check.yaml):
# tiny Kimi-shaped target built and trained, HF reference dumps, an init drafter, `eagle3 patch
# apply` on the real deepseek_v2.py, `sglang-launch extract` (0.5.14 + drafter), canary (also vs
# SGLang's own return_hidden_states, two requests batched), `extract --server`, dumps vs the
# reference, drafter trained on the SGLang dumps, `sglang-launch serve` (EAGLE3), serve-check,
# accept vs the reference decoder, revert + byte check. -> $OUT/sglang-real.json + logs.
#   run: carry [".whl"], command: bash bench/gpu_sglang.sh          (SIZES=quick for a smoke run;
#   BUDGET_S=560: staging + runbook stop by then so the report is always written; RESUME=1 on
#   the still-warm machine continues that run; a step the cut left `lost` is retried on that resume)
#
# STAGE (the integrator puts these in .whl/sgl/, one carry), either
#   .whl/sgl/site.tar.xz         bench/stage_sglang.sh: sglang 0.5.14, its slim kernel, the serving
#                                stack and eagle-tui's deps (textual, rich, asyncssh, pyyaml, ...),
#                                unpacked into /tmp/site at the END of sys.path (image packages win)
# or the older layout (put FIRST on sys.path):
#   .whl/sgl/sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl   (unzipped, py3.12 is fine)
#   .whl/sgl/sgl_kernel.tgz      sglang-kernel 0.4.4 without flash_ops.abi3.so and sm100/
#   .whl/sgl/wheels/*.whl        SGLang's pure-python deps and eagle-tui's for the headless runbook
#                                engine: rich markdown-it-py mdurl pygments (pydantic, pyyaml)
#   RUNBOOK / REPORT: another check on the same staging (bench/gpu_sglang_kimi.sh: the Kimi-K2.5
#   wrapper, runbooks/gpu-sglang-check-kimi.yaml -> sglang-kimi-k25.json); KEEP_FILES: more of
#   $WORK's results returned beside the report instead of inside bundle.tgz (e.g. online.json)
#   SGLANG_STANDIN=1: the CPU rehearsal (bench/rehearse_kimi_cpu.sh): $SITE already holds a
#   stand-in SGLang (bench/sglang_standin.py behind the real deepseek_v2.py): it is kept, and
#   neither the stub probe nor the flashinfer warm-up runs
set -u
cd "$(dirname "$0")/.."
RB=${RUNBOOK:-runbooks/gpu-sglang-check.yaml}; REPORT_NAME=${REPORT:-sglang-real.json}
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
S=${SITE:-/tmp/site}; W=${WHL:-.whl/sgl}; WORK=${WORK:-/tmp/sglang-check}; STATE=${STATE:-/tmp/sglang-check-state}
ST=${STUBS_DIR:-/tmp/stubs}; BIN=${BIN_DIR:-/tmp/bin}  # all overridable for a CPU rehearsal
T=$S/sglang/srt/models/deepseek_v2.py
PRISTINE=947fdc256101f538a668090f82e5eb5f888e2434f2bbbf69a99cdaa628cf902e
t0=$(date +%s)
declare -A SECS
stage_start() { echo "== $1 ($(( $(date +%s) - t0 ))s)"; ts=$(date +%s); }
stage_end() { SECS[$1]=$(( $(date +%s) - ts )); }

# ---- staging (a warm machine keeps /tmp: start clean) ----
stage_start staging
# RESUME=1 on a machine still warm from a run cut by the device's 10 minutes: keep the staged
# site, the work and the run state, and continue that run (`--run latest`) where it stopped
if [ "${RESUME:-}" = 1 ] && [ -d $STATE/runs ] && [ -f $S/sglang/version.py ]; then
  RESUMING=1; rm -rf $ST; mkdir -p $ST $BIN
elif [ "${SGLANG_STANDIN:-}" = 1 ]; then  # the rehearsal's site: staged by its caller
  RESUMING=""; rm -rf $ST $WORK $STATE; mkdir -p $ST $BIN
else
  RESUMING=""; rm -rf $S $ST $WORK $STATE; mkdir -p $S $ST $BIN
fi
ln -sf "$(command -v python3)" $BIN/python  # runbook steps say `python`
mkdir -p $STATE; echo "$(date +%s)" >> $STATE/calls  # device calls this run took (RESUME=1 adds one)
export PATH=$BIN:$PATH
if [ -n "$RESUMING" ]; then
  FIRST=""; echo "resuming: staged site kept" > $OUT/staging.log
elif [ "${SGLANG_STANDIN:-}" = 1 ]; then
  FIRST=$S:; echo "stand-in SGLang site $S (CPU rehearsal)" > $OUT/staging.log
elif [ -f $W/site.tar.xz ]; then
  tar xJf $W/site.tar.xz -C $S; FIRST=""; echo "staged site.tar.xz" > $OUT/staging.log
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $S $W/wheels/*.whl \
    > $OUT/staging.log 2>&1; echo "pip rc=$?" >> $OUT/staging.log
  python3 -c "import zipfile,glob; zipfile.ZipFile(glob.glob('$W/sglang-0.5.14-*.whl')[0]).extractall('$S')"
  tar xzf $W/sgl_kernel.tgz -C $S; FIRST=$S:
fi
# Only SGLang's processes get the compat shims and the stubs (in every other process a stub of a
# missing optional module would make transformers think it is there): the server is recognised
# by its command line, its spawned schedulers by the variable it sets.
mkdir -p $ST/site $ST/mods
echo "import os, sys; _S, _M = '$S', '$ST/mods'" > $ST/site/sitecustomize.py
cat >> $ST/site/sitecustomize.py <<'PYX'
if _S not in sys.path:  # at the end: what the image has wins (site.tar.xz layout)
    sys.path.append(_S)
if "sglang.launch_server" in " ".join(getattr(sys, "orig_argv", [])):
    os.environ["EAGLE3_SGLANG_SHIMS"] = "1"
if os.environ.get("EAGLE3_SGLANG_SHIMS"):
    sys.path.append(_M)  # after everything: only modules missing everywhere are stubbed
    try:  # transformers 5.17 (the image's) registers configs sglang 0.5.14 registers again
        from transformers.models.auto import configuration_auto as _ca
        _orig = _ca._LazyConfigMapping.register
        def _reg(self, key, value, exist_ok=False):
            return _orig(self, key, value, exist_ok=True)
        _ca._LazyConfigMapping.register = _reg
        from transformers import AutoModel, AutoProcessor, AutoTokenizer, AutoImageProcessor
        for _c in (AutoModel, AutoProcessor, AutoTokenizer, AutoImageProcessor):
            _o = _c.register
            def _r(*a, _o=_o, **k):
                k["exist_ok"] = True
                try:
                    return _o(*a, **k)
                except TypeError:
                    k.pop("exist_ok"); return _o(*a, **k)
            _c.register = _r
    except Exception as e:
        print("sitecustomize:", e, file=sys.stderr)  # never on stdout: callers parse it
PYX
export PYTHONPATH=${FIRST}$ST/site:$PWD
STUBS=""
# the optional modules the image lacked on 2026-12-02 (stubbed up front: each probe below costs a
# full sglang import); the loop still finds any other
for m in IPython IPython.display jsonschema soundfile; do  # (IPython.display: found 2026-12-04)
  python3 -c "import $m" 2>/dev/null && continue
  STUBS="$STUBS $m"; d=$ST/mods/$(echo $m | tr . /); mkdir -p $d
  printf 'def __getattr__(n):\n    if n.startswith("__"): raise AttributeError(n)\n    return type(n, (), {"__init__": lambda s,*a,**k: None, "__call__": lambda s,*a,**k: None})\n' > $d/__init__.py
done
for i in $(seq 30); do  # optional modules not carried are stubbed and listed in the results
  [ "${SGLANG_STANDIN:-}" = 1 ] && break  # a stand-in imports nothing optional
  err=$(EAGLE3_SGLANG_SHIMS=1 python3 -c "import sglang.srt.models.deepseek_v2, sglang.srt.entrypoints.http_server, sglang.srt.models.llama_eagle3" 2>&1 | grep -oE "No module named '[^']+'" | head -1 | sed "s/No module named '//; s/'//")
  [ -z "$err" ] && break
  STUBS="$STUBS $err"; d=$ST/mods/$(echo $err | tr . /); mkdir -p $d
  printf 'def __getattr__(n):\n    if n.startswith("__"): raise AttributeError(n)\n    return type(n, (), {"__init__": lambda s,*a,**k: None, "__call__": lambda s,*a,**k: None})\n' > $d/__init__.py
done
echo "stubs:$STUBS"
python3 -c "import eagle_tui.cli" > $OUT/engine-import.log 2>&1; ENGINE=$?
# flashinfer compiles its kernels on first use (nvcc + ninja of the image): build the two the
# servers need (RMSNorm, DeepSeek's fused top-k routing) while the target trains; a server that
# gets there first waits on flashinfer's build lock instead of failing
[ "${SGLANG_STANDIN:-}" = 1 ] || ( EAGLE3_SGLANG_SHIMS=1 timeout 400 python3 -c "
import time; t = time.time()
from flashinfer.norm import get_norm_module; get_norm_module(); print('norm', round(time.time() - t, 1), flush=True)
from flashinfer.fused_moe.fused_routing_dsv3 import get_dsv3_fused_routing_module
get_dsv3_fused_routing_module(); print('dsv3 routing', round(time.time() - t, 1), flush=True)
" > $OUT/jit-warm.log 2>&1; echo "rc=$?" >> $OUT/jit-warm.log ) &
stage_end staging

# ---- the pipeline, through the runbook engine (per-step seconds and errors in its state) ----
SETS=(--set site=$S --set work=$WORK)
if [ "${SIZES:-}" = quick ]; then
  SETS+=(--set target_steps=20 --set per_source=48 --set prompts=16 --set draft_steps=20 --set accept_n=8)
fi
if [ -n "${EXTRA_SETS:-}" ]; then  # e.g. "preset=ci device=cpu" for a CPU rehearsal
  for kv in $EXTRA_SETS; do SETS+=(--set "$kv"); done
fi
stage_start runbook
# the device allows 10 minutes a command: staging + runbook end by BUDGET_S, the report follows
END=$(( t0 + ${BUDGET_S:-560} ))
RBRC=125
CHECK=bench/gpu_sglang_check.py
source bench/drive_runbook.sh
if [ $ENGINE -eq 0 ]; then
  drive_runbook
else
  echo "eagle-tui does not import (deps not staged?): see engine-import.log" > $OUT/runbook.log
fi
echo "runbook rc=$RBRC"; tail -30 $OUT/runbook.log
stage_end runbook
python3 -m eagle_tui.cli status --state-dir $STATE --json > $OUT/state.json 2> $OUT/state.err

# ---- a server step that died: its log tail, then the same launch with the hook off and with
# no drafter at all (which part breaks), as long as the device's 10 minutes allow ----
for step in extraction-server serve-drafter serve-drafter-llama serve-drafter-mla; do
  st=$(python3 -c "import json,sys; print(json.load(open('$OUT/state.json'))['steps']['$step']['status'])" 2>/dev/null)
  [ "$st" = failed ] || [ "$st" = lost ] || continue
  [ "${DIAG:-1}" = 1 ] || { echo "DIAG=0: no relaunch diagnosis of $step"; continue; }
  left=$(( t0 + 590 - $(date +%s) - 40 ))
  [ $left -gt 60 ] || { echo "no time to diagnose $step"; continue; }
  stage_start diag-$step
  python3 bench/gpu_sglang_check.py diag-launch --state $OUT/state.json --step $step \
    --out $OUT/diag/$step.json --wait-s $(( left / 2 < 110 ? left / 2 : 110 ))
  stage_end diag-$step
done

# ---- guards that run whatever the runbook reached: the patch is reverted, bytes checked ----
stage_start revert-guard
python3 -m remote_agent.eagle3 patch status --target $T --json > $OUT/patch-status-end.json 2> $OUT/patch-status-end.err
grep -q '"state": "pristine"' $OUT/patch-status-end.json || \
  python3 -m remote_agent.eagle3 patch revert --target $T --version 0.5.14 --json \
    > $WORK/patch-revert.json 2> $OUT/patch-revert.err
BYTES_OK=$( [ "$(sha256sum $T | cut -c1-64)" = $PRISTINE ] && echo true || echo false )
stage_end revert-guard

# ---- report ----
cp -f $WORK/*.json $WORK/*.txt $OUT/ 2>/dev/null
mkdir -p $OUT/logs; cp -f $STATE/runs/*/logs/*.log $OUT/logs/ 2>/dev/null
for f in $WORK/sglang-dumps/sglang-server.log $WORK/sglang-dumps/canary/vs-sglang.json; do cp -f $f $OUT/ 2>/dev/null; done
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
python3 - "$OUT" "$t0" "$RBRC" "$BYTES_OK" "$STUBS" "${SECS[staging]}" "${SECS[runbook]}" "$RB" "$(wc -l < $STATE/calls)" "${CARD:-no GPU}" <<'PY' > $OUT/extra.json
import json, sys, time
out, t0, rbrc, ok, stubs, st, rb, book, calls, card = sys.argv[1:11]
print(json.dumps({
  "run": f"bench/gpu_sglang.sh: {book} on one {card}, real SGLang 0.5.14",
  "calls": int(calls),
  "runbook_exit_code": int(rbrc), "revert_byte_identical": ok == "true",
  "stubbed_modules": stubs.split(), "script_seconds": {"staging": int(st), "runbook": int(rb)},
  "wall_seconds": int(time.time()) - int(t0),
}))
PY
python3 bench/gpu_sglang_check.py report --work $WORK --state $OUT/state.json --extra $OUT/extra.json \
  --out $OUT/$REPORT_NAME ${REPORT_FLAVOURS:+--flavours $REPORT_FLAVOURS}
# the device returns at most 8 files: everything else travels in one archive
python3 - "$OUT/state.json" <<'PY'
import json, sys
try:
    steps = json.load(open(sys.argv[1]))["steps"]
except Exception as exc:
    sys.exit(f"no state: {exc}")
for sid, rec in steps.items():
    if rec.get("status") in ("failed", "lost") and rec.get("log_file"):
        print(f"== {sid} {rec['status']}: {rec.get('reason')} {rec.get('message') or ''}")
        try:
            print("\n".join(open(rec["log_file"], errors="replace").read().splitlines()[-40:]))
        except OSError as exc:
            print(exc)
PY
KEEP=(bundle.tgz $REPORT_NAME runbook.log ${KEEP_FILES:-})
( cd $OUT && tar czf bundle.tgz --warning=no-file-changed "${KEEP[@]/#/--exclude=}" . ; [ $? -le 1 ] \
  && find . -mindepth 1 -maxdepth 1 $(printf '! -name %s ' "${KEEP[@]}") \
     -exec rm -rf {} + )
echo "total $(( $(date +%s) - t0 ))s"
