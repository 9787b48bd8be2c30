"""The canary against SGLang itself: two requests of different lengths sent in one batched
`/generate` call with `return_hidden_states`; the hook's dump of each must equal, bit for bit,
the rows SGLang hands back for that request. SGLang is then the reference for the rid-to-rows
mapping (which rows of a shared forward belong to which request), not our own stand-ins.

What `return_hidden_states` returns (read in 0.5.14's source; 0.5.23 is the same):
- the logits processor's `hidden_states_to_store` in CaptureHiddenMode.FULL, which the EAGLE3
  worker (0.5.14) or the request's flag sets for the target's prefill: with aux capture on, the
  aux hidden states concatenated on the last dim, [T, K*H] in ascending layer order, i.e. the
  pre-norm residual stream entering each capture layer: exactly the hook's `aux`; with capture
  off, the final post-norm hidden states [T, H] (the hook's `final`). `hidden_states_before_norm`
  replaces it only for multi-layer EAGLE, which extraction never runs.
- per request, rows `[offset, offset + len(origin_input_ids))` of that batch tensor
  (batch_result_processor._append_prefill_hidden_states) as nested lists of the bf16 values,
  so JSON carries them exactly. With `max_new_tokens` 1 no decode rows follow.
So a server with aux capture on is compared on `aux` (every prompt position); the dumped
`final` has no SGLang counterpart then: the final-state check (final_check.py) covers it, the
dumped final's last row must predict the token SGLang generated for the same request.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from remote_agent.eagle3.dense import CANARY_DIR, DumpFormatError, DumpReader, read_error_markers
from remote_agent.eagle3.errors import Failed
from remote_agent.eagle3.extraction.dataset import CONTROL_PREFIX
from remote_agent.eagle3.extraction.server import ServerError
from remote_agent.eagle3.http_client import HttpClient

CANARY = CONTROL_PREFIX + "canary:"
RESULT_NAME = "vs-sglang.json"


def batched_body(rids: list[str], prompts: list[list[int]]) -> dict[str, Any]:
    return {
        "input_ids": prompts,
        "rid": rids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
        "stream": False,
    }


def prefill_rows(answer: dict[str, Any]) -> list[list[float]]:
    """The prefill rows of one request's `meta_info.hidden_states` (first entry: [T][W])."""
    hs = (answer.get("meta_info") or {}).get("hidden_states")
    if not isinstance(hs, list) or not hs:
        raise Failed(
            f"SGLang returned no hidden_states for {answer.get('meta_info', {}).get('id')}"
        )
    first = hs[0]
    if first and isinstance(first[0], (int, float)):
        return [first]  # a single row (a one-token prompt)
    return first


def compare_rows(sample: dict[str, Any], rows: list[list[float]]) -> dict[str, Any]:
    """Bit-exact comparison of one dumped sample with SGLang's rows, on the matching tensor."""
    import torch

    theirs = torch.tensor(rows, dtype=torch.float32)
    aux, final = sample["aux"].float(), sample["final"].float()
    tensor = {aux.shape[1]: "aux", final.shape[1]: "final"}.get(theirs.shape[-1])
    out: dict[str, Any] = {"tokens": int(aux.shape[0]), "sglang_shape": list(theirs.shape)}
    if tensor is None:
        out.update(compared=None, equal=False, reason=f"width {theirs.shape[-1]} matches no dump")
        return out
    ours = aux if tensor == "aux" else final
    out["compared"] = tensor
    if theirs.shape != ours.shape:
        out.update(equal=False, reason=f"rows {tuple(theirs.shape)} vs dumped {tuple(ours.shape)}")
        return out
    diff = (theirs - ours).abs()
    out.update(
        equal=bool(torch.equal(theirs, ours)),
        max_abs_err=float(diff.max()) if diff.numel() else 0.0,
        rows_differing=int((diff.amax(dim=1) > 0).sum()) if diff.numel() else 0,
    )
    return out


def compare_with_sglang(
    http: HttpClient,  # server.Http(url)
    out: Path,
    rid_prefix: str,
    prompts: list[list[int]],
    timeout: float = 120.0,
    poll_s: float = 0.5,
    lm_head: Any = None,
) -> dict[str, Any]:
    """Send `prompts` batched, wait for their canary dumps, compare; written to canary/RESULT_NAME.
    With the target's `lm_head`, also the final-state check against SGLang's generated tokens."""
    nonce = uuid.uuid4().hex[:10]
    sids = [f"{CANARY}rhs-{nonce}-{i}" for i in range(len(prompts))]
    try:
        answers = http.post("/generate", batched_body([rid_prefix + s for s in sids], prompts))
    except ServerError as exc:
        raise Failed(f"the return_hidden_states canary request failed: {exc}") from None
    if not isinstance(answers, list) or len(answers) != len(prompts):
        raise Failed(
            f"a batched /generate answered {type(answers).__name__}, not {len(prompts)} items"
        )
    root = out / CANARY_DIR
    deadline = time.monotonic() + timeout
    while True:
        markers = read_error_markers(out)
        bad = [markers[s] for s in sids if s in markers]
        if bad:
            raise Failed(f"the canary failed in the hook: {bad[0].get('reason')}")
        try:
            reader = DumpReader(root) if (root / "meta.json").exists() else None
        except DumpFormatError:
            reader = None
        if reader is not None and all(s in reader for s in sids):
            break
        if time.monotonic() > deadline:
            raise Failed(f"the batched canary was not dumped into {root} within {timeout:.0f}s")
        time.sleep(poll_s)
    per, finals, tokens = [], [], []
    for sid, prompt, answer in zip(sids, prompts, answers, strict=True):
        sample = reader.get(sid)
        row = compare_rows(sample, prefill_rows(answer))
        row.update(sid=sid, ids_equal=sample["input_ids"].tolist() == prompt)
        per.append(row)
        finals.append(sample["final"])
        tokens.append(generated_token(answer))
    shards = {str(reader.index[s].shard) for s in sids}
    reader.close()
    compared = sorted({str(r.get("compared")) for r in per})
    result = {
        "bit_exact": all(r["equal"] and r["ids_equal"] for r in per),
        "samples": len(per),
        "shared_forward": len(shards) == 1,  # the hook writes one canary shard per forward
        "compared": compared,
        "not_compared": ["final"] if compared == ["aux"] else [],
        "max_abs_err": max((r.get("max_abs_err", float("inf")) for r in per), default=None),
        "per_sample": per,
    }
    if lm_head is not None:
        from remote_agent.eagle3.extraction.final_check import check_against_server

        result["final_state_check"] = check_against_server(finals, tokens, lm_head, sids)
    (root / RESULT_NAME).write_text(json.dumps(result, indent=1))
    return result


def generated_token(answer: dict[str, Any]) -> int:
    """The one token SGLang generated for a request (`output_ids`, greedy)."""
    out = answer.get("output_ids")
    if not isinstance(out, list) or not out:
        raise Failed(f"SGLang returned no output_ids for {answer.get('meta_info', {}).get('id')}")
    return int(out[0])
