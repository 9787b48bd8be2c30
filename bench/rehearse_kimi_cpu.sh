#!/usr/bin/env bash
# The CPU rehearsal of the device run `bash bench/gpu_sglang_kimi.sh` (issue 26's Kimi-K2.5 check
# with issue 30's online bench in it): the same script, runbook (runbooks/gpu-sglang-check-kimi.yaml),
# steps, engine and report code, on this machine's CPU, with tiny sizes and a stand-in SGLang
# (bench/sglang_standin.py) where the real 0.5.14 server cannot run. The stand-in sits behind the
# REAL 0.5.14 deepseek_v2.py (hash guard, `eagle3 patch apply`, revert byte-exact) and calls the
# real installed hook per batch (dense + stream: EAGLE3_DUMP_MODE=both); serving is the torch
# reference decoder. It proves wiring, never figures: every result it writes says "cpu-standin".
#
#   bash bench/rehearse_kimi_cpu.sh          # -> $REHEARSAL_DIR/out (default /tmp/rehearse-kimi/out):
#                                            #    sglang-kimi-k25.json, online.json, runbook.log, bundle.tgz
# Needs the project's Python first on PATH (torch, transformers, tiktoken, the engine's deps) and
# the sglang 0.5.14 wheel: $SGLANG_WHEEL, else the test cache's (.cache/wheels, downloaded once).
# Exit 0 only when every step succeeded and online.json says equal_to_offline.
set -u
cd "$(dirname "$0")/.."
R=${REHEARSAL_DIR:-/tmp/rehearse-kimi}
export OUT=${OUT:-$R/out}
rm -rf "$R/site" "$OUT"; mkdir -p "$R/site" "$OUT"
WHEEL=${SGLANG_WHEEL:-$(python3 -c "
import sys; sys.path.insert(0, '.')
from tests.conftest import download_sglang_wheel; print(download_sglang_wheel('0.5.14'))")}
[ -f "$WHEEL" ] || { echo "no sglang 0.5.14 wheel ($WHEEL)"; exit 2; }

# the site: the release's own deepseek_v2.py and version files, a stand-in for the rest
python3 - "$WHEEL" "$R/site" <<'PY'
import sys, zipfile
from pathlib import Path
wheel, site = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(wheel) as z:
    for name in ("sglang/srt/models/deepseek_v2.py", "sglang/version.py", "sglang/_version.py"):
        z.extract(name, site)
for pkg in ("sglang", "sglang/srt", "sglang/srt/models"):
    (site / pkg / "__init__.py").write_text("")  # the real ones import all of SGLang
(site / "sglang" / "launch_server.py").write_text(
    "import runpy, sys\n"
    f"sys.argv[0] = {str(Path.cwd() / 'bench' / 'sglang_standin.py')!r}\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
(site / "sglang" / "srt" / "runtime_context.py").write_text(  # what the hook asks SGLang
    "from types import SimpleNamespace\n"
    "SERVER_ARGS = SimpleNamespace(dp_size=1, enable_dp_attention=False)  # set by the stand-in\n"
    "def get_parallel():\n"
    "    return SimpleNamespace(attn_tp_rank=0, attn_cp_rank=0, attn_dp_size=1, attn_dp_rank=0,\n"
    "                           tp_size=1, attn_tp_size=1, attn_cp_size=1, pp_size=1)\n"
    "def get_server_args():\n"
    "    return SERVER_ARGS\n"
)
# the release the hash guard reads beside deepseek_v2.py (the file is 0.5.14's own); the stand-in
# says what it is in /server_info ("0.5.14+cpu-standin"), which the reports record
info = site / "sglang-0.5.14.dist-info"
info.mkdir()
(info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.14\n")
PY

# target_steps=0: an untrained target stays in bf16 as saved (the GPU run trains it under bf16
# autocast and saves bf16; a CPU-trained one is saved float32, which sglang-launch rightly refuses
# beside a bf16 drafter)
SIZES="preset=kimi-k25-ci device=cpu target_steps=0 target_batch=4 seq_len=64 per_source=12
prompts=4 new_tokens=16 regen_batch=4 max_len=256 draft_vocab=256 draft_steps=2
draft_max_tokens=512 accept_n=2 accept_tokens=8 min_final_agreement=0 online_samples=12
online_epochs=2 online_max_tokens=128"
SGLANG_STANDIN=1 SITE="$R/site" WORK="$R/work" STATE="$R/state" STUBS_DIR="$R/stubs" \
  BIN_DIR="$R/bin" BUDGET_S=${BUDGET_S:-1500} DIAG=0 EXTRA_SETS="$SIZES ${EXTRA_SETS:-}" \
  bash bench/gpu_sglang_kimi.sh
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}
report, online = load("sglang-kimi-k25.json"), load("online.json")
bad = {k: v.get("status") for k, v in report.get("stages", {}).items() if v.get("status") != "succeeded"}
bad = bad or ({"report": report["error"]} if "error" in report else {})
print(f"rehearsal: {len(report.get('stages', {}))} steps, not succeeded: {bad or 'none'}; "
      f"sglang_version {report.get('sglang_version')!r}; online equal_to_offline "
      f"{online.get('equal_to_offline')} (max abs diff {online.get('max_abs_diff_final_weights')}), "
      f"online.sglang_version {online.get('sglang_version')!r}")
sys.exit(0 if not bad and online.get("equal_to_offline") is True else 1)
PY
