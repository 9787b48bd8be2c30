#!/usr/bin/env bash
# A real SGLang 0.5.14 on one H200 (issue 16): stage the carried wheels (.whl/sgl: sglang 0.5.14,
# sgl_kernel.tgz = sglang-kernel 0.4.4 without flash_ops.abi3.so and sm100/, pure-python deps),
# build a tiny DeepseekV3 with Kimi's MLA dims and Kimi-K2.5's context settings, patch the real
# deepseek_v2.py with `eagle3 patch apply`, start the real server, canary against HF greedy,
# SGLang's return_hidden_states, revert and check byte identity. -> $OUT/sglang-real.json + logs.
#   run: carry [".whl"], command: bash bench/gpu_sglang.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
S=/tmp/site; W=.whl/sgl; rm -rf $S /tmp/stubs /tmp/tiny; mkdir -p $S /tmp/stubs  # a warm machine keeps /tmp
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $S $W/wheels/*.whl 2>&1 | tail -3
python3 -c "import zipfile,glob; zipfile.ZipFile(glob.glob('$W/sglang-0.5.14-*.whl')[0]).extractall('$S')"
tar xzf $W/sgl_kernel.tgz -C $S
# transformers 5.17 (the image's) already registers configs sglang 0.5.14 (pinned 5.8.1) registers again
cat > /tmp/stubs/sitecustomize.py <<'PYX'
try:
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
    print("sitecustomize:", e)
PYX
export PYTHONPATH=$S:/tmp/stubs:$PWD
STUBS=""
for i in $(seq 30); do  # optional modules not carried are stubbed and listed in the results
  err=$(python3 -c "import sglang.srt.models.deepseek_v2, sglang.srt.entrypoints.http_server" 2>&1 | grep -oE "No module named '[^']+'" | head -1 | sed "s/No module named '//; s/'//")
  [ -z "$err" ] && break
  STUBS="$STUBS $err"; d=/tmp/stubs/$(echo $err | tr . /); mkdir -p $d
  printf 'def __getattr__(n):\n    if n.startswith("__"): raise AttributeError(n)\n    return type(n, (), {"__init__": lambda s,*a,**k: None, "__call__": lambda s,*a,**k: None})\n' > $d/__init__.py
done
echo "stubs:$STUBS"; echo "$STUBS" > $OUT/stubs.txt
T=$S/sglang/srt/models/deepseek_v2.py; sha256sum $T | cut -c1-64 > /tmp/pristine.sha
python3 -m remote_agent.eagle3 patch apply --target $T --json > $OUT/patch-apply.json 2>&1; echo "patch apply rc=$?"
python3 - <<'PY' > $OUT/build.log 2>&1
import json, torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
cfg = DeepseekV3Config(vocab_size=4096, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256,
    num_hidden_layers=6, num_attention_heads=16, num_key_value_heads=16, n_routed_experts=8, num_experts_per_tok=2,
    n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=256, kv_lora_rank=512, qk_rope_head_dim=64,
    qk_nope_head_dim=128, v_head_dim=128, n_group=1, topk_group=1, max_position_embeddings=262144,
    rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                  "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}, torch_dtype="bfloat16")
torch.manual_seed(0)
m = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16); m.save_pretrained("/tmp/tiny")
# keys Kimi's config.json carries that transformers 5.17's DeepseekV3Config drops but SGLang 0.5.14
# reads (seen: moe_layer_freq AttributeError while building the layers)
c = json.load(open("/tmp/tiny/config.json"))
c.update(moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid", ep_size=1)
json.dump(c, open("/tmp/tiny/config.json", "w"), indent=1)
ids = torch.tensor([[5, 17, 99, 1000, 7, 300, 42, 8]])
out = m.cuda().generate(ids.cuda(), max_new_tokens=8, do_sample=False)
json.dump({"hf_greedy": out[0, 8:].tolist()}, open("/tmp/hf.json", "w")); print("HF greedy", out[0, 8:].tolist())
PY
tail -3 $OUT/build.log
python3 -m sglang.launch_server --model-path /tmp/tiny --skip-tokenizer-init --attention-backend triton \
  --grammar-backend none --disable-cuda-graph --mem-fraction-static 0.3 --port 30000 --trust-remote-code \
  --enable-return-hidden-states --disable-radix-cache > $OUT/server.log 2>&1 &
SP=$!
for i in $(seq 150); do curl -s -m 2 localhost:30000/health >/dev/null 2>&1 && break; kill -0 $SP 2>/dev/null || break; sleep 2; done
curl -s -m 200 localhost:30000/generate -H 'content-type: application/json' -d '{"input_ids":[5,17,99,1000,7,300,42,8],"sampling_params":{"max_new_tokens":8,"temperature":0},"return_hidden_states":true}' > $OUT/generate.json; echo
curl -s -m 10 localhost:30000/server_info > /tmp/server_info.json
kill $SP 2>/dev/null; sleep 3; kill -9 $SP 2>/dev/null
python3 -m remote_agent.eagle3 patch revert --target $T --json > $OUT/patch-revert.json 2>&1; echo "patch revert rc=$?"
python3 - "$OUT" "$t0" <<'PY'
import json, sys, hashlib, time, pathlib
out = pathlib.Path(sys.argv[1]); T = "/tmp/site/sglang/srt/models/deepseek_v2.py"
def load(p):
    try: return json.loads(pathlib.Path(p).read_text())
    except Exception as e: return {"error": f"{p}: {e}"}
gen = load(out / "generate.json"); hf = load("/tmp/hf.json"); info = load("/tmp/server_info.json")
ids = gen.get("output_ids") if isinstance(gen, dict) else None
hs = (gen.get("meta_info") or {}).get("hidden_states") if isinstance(gen, dict) else None
res = {
  "sglang_version": "0.5.14", "run": "bench/gpu_sglang.sh (one real SGLang 0.5.14 server on one H200)",
  "target_context_length": info.get("context_length") if isinstance(info, dict) else None,
  "server_info_keys": sorted(info)[:80] if isinstance(info, dict) else None,
  "patch_apply": load(out / "patch-apply.json"), "patch_revert": load(out / "patch-revert.json"),
  "revert_byte_identical": hashlib.sha256(open(T, "rb").read()).hexdigest() == "947fdc256101f538a668090f82e5eb5f888e2434f2bbbf69a99cdaa628cf902e",
  "canary": {"sglang_output_ids": ids, "hf_greedy": hf.get("hf_greedy"), "identical": ids is not None and ids == hf.get("hf_greedy")},
  "return_hidden_states": {"returned": hs is not None, "shape_outer": len(hs) if isinstance(hs, list) else None},
  "dumps_vs_reference": None, "dumps_vs_sglang_hidden_states": None, "accept_length": None,
  "not_run": "sglang 0.5.14 has no --enable-return-aux-hidden-states/--return-aux-hidden-state-layer-ids: sglang-launch extract refuses it, so no dumps, no drafter training on them, no serve/accept",
  "stubbed_modules": (out / "stubs.txt").read_text().split(), "secs": int(time.time()) - int(sys.argv[2]),
}
(out / "sglang-real.json").write_text(json.dumps(res, indent=1)); print(json.dumps({k: res[k] for k in ("target_context_length", "revert_byte_identical", "canary")}))
PY
tail -20 $OUT/server.log
