"""The final-state check: the dumped `final` row is the teacher's input, so the token it predicts
(argmax of final @ lm_head^T, after the final norm when the state is pre-norm) must be the token
the target itself produces there.

- against SGLang (the canary): for prompts SGLang answers greedily with one token, the argmax at
  the dumped final's last row must be that token. In 0.5.14's capture mode `return_hidden_states`
  hands back the aux rows only, so without this a wrong `final` would train the drafter on a
  wrong teacher with no error anywhere.
- against the data (`verify-dumps --model`): sampled supervised rows, argmax at row t vs the
  data's token t+1. Greedy-regenerated answers agree almost everywhere, human-written ones as
  often as the target's top-1 accuracy; a corrupted, shifted or foreign `final` agrees almost
  nowhere. A sample far below its own source's rate is named, with its rows: the baseline is
  per source because one dump mixes both kinds (on the H100 run of 12-07 a dump-wide baseline of
  22% named 18 human-written `explain` samples whose finals matched SGLang's own tokens).

Near-ties are not mismatches: SGLang's bf16 logits can order two tokens within rounding of each
other differently from this fp32 product (`tie_tolerance`, relative to the top logit).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput

LM_HEAD_KEYS = ("lm_head.weight", "language_model.lm_head.weight")
NORM_KEYS = ("model.norm.weight", "language_model.model.norm.weight")
TIE_TOLERANCE = 1e-2


def _tensor_names(model_dir: Path) -> dict[str, Path]:
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        return {k: model_dir / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    names: dict[str, Path] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            names.update({k: f for k in h.keys()})  # noqa: SIM118 (safe_open is not a dict)
    return names


def load_lm_head(model_dir: Path, key: str | None = None) -> Any:
    """The target's lm_head [V, H] in float32 (flat: lm_head.weight; Kimi-K2.5's released layout:
    language_model.lm_head.weight)."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    names = _tensor_names(model_dir)
    for k in (key,) if key else LM_HEAD_KEYS:
        if k in names:
            with safe_open(str(names[k]), framework="pt") as h:
                return h.get_tensor(k).float()
    raise BadInput(
        f"{model_dir}: no lm_head tensor ({', '.join((key,) if key else LM_HEAD_KEYS)}) in its "
        "safetensors files"
    )


def predicted(final: Any, lm_head: Any, norm_weight: Any = None, eps: float = 1e-6) -> Any:
    """[N] argmax ids and [N, V] fp32 logits of final rows [N, H]; `norm_weight`: apply the
    target's RMSNorm first (a pre-norm state; SGLang's dump is post-norm already)."""
    import torch

    h = final.float()
    if norm_weight is not None:
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    logits = h @ lm_head.float().T
    return logits.argmax(-1), logits


def agrees(logits_row: Any, want: int, tol: float = TIE_TOLERANCE) -> bool:
    """True when `want` is the argmax, or within `tol` (relative to the top logit) of it."""
    top = float(logits_row.max())
    return float(logits_row[want]) >= top - tol * max(1.0, abs(top))


def check_against_server(
    finals: list[Any], tokens: list[int], lm_head: Any, names: list[str] | None = None
) -> dict[str, Any]:
    """Each dumped final's last row must predict the token the server generated after it."""
    per = []
    for i, (final, tok) in enumerate(zip(finals, tokens, strict=True)):
        arg, logits = predicted(final[-1:], lm_head)
        ok = int(arg[0]) == tok or agrees(logits[0], tok)
        per.append(
            {
                "sample": names[i] if names else i,
                "sglang_token": int(tok),
                "dump_argmax": int(arg[0]),
                "match": ok,
                "exact": int(arg[0]) == tok,
            }
        )
    return {
        "prompts": len(per),
        "argmax_matches": sum(p["match"] for p in per),
        "exact_matches": sum(p["exact"] for p in per),
        "ok": all(p["match"] for p in per),
        "per_prompt": per,
    }


@dataclass
class DataCheck:
    rows: int = 0
    agree: int = 0
    samples: int = 0
    low: list[str] = field(default_factory=list)  # located: sample id, rows, its rate
    sources: dict[str, float] = field(default_factory=dict)  # each source's agreement rate

    @property
    def rate(self) -> float:
        return self.agree / self.rows if self.rows else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "rows": self.rows,
            "agree": self.agree,
            "rate": round(self.rate, 4),
            "source_rates": {k: round(v, 4) for k, v in sorted(self.sources.items())},
            "low_samples": self.low[:20],
        }


def check_against_data(
    reader: Any,
    dataset: Any,
    lm_head: Any,
    samples: int = 64,
    rows_per_sample: int = 32,
    seed: int = 0,
    min_rows: int = 8,
) -> DataCheck:
    """Sampled supervised rows of sampled samples: argmax(final[t]) vs the data's token t+1."""
    import torch

    ids = [s for s in reader.ids() if s in dataset]
    rng = random.Random(seed)
    picks = rng.sample(ids, min(samples, len(ids)))
    out = DataCheck()
    rates: list[tuple[str, str, int, int, list[int]]] = []
    for sid in picks:
        rec = dataset.index.read(sid)
        source = str(getattr(rec, "source", "") or "")
        mask = list(getattr(rec, "loss_mask", None) or [1] * len(rec.input_ids))
        data = rec.input_ids
        rows = [t for t in range(len(data) - 1) if mask[t + 1]]
        if not rows:
            continue
        rows = sorted(rng.sample(rows, min(rows_per_sample, len(rows))))
        final = reader.get(sid)["final"]
        arg, logits = predicted(final[torch.tensor(rows)], lm_head)
        hits = [
            int(a) == data[t + 1] or agrees(logits[j], data[t + 1])
            for j, (a, t) in enumerate(zip(arg.tolist(), rows, strict=True))
        ]
        out.samples += 1
        out.rows += len(rows)
        out.agree += sum(hits)
        rates.append(
            (
                sid,
                source,
                len(rows),
                sum(hits),
                [t for t, h in zip(rows, hits, strict=True) if not h],
            )
        )
    per_source: dict[str, list[int]] = {}
    for _, source, n, hit, _ in rates:
        tally = per_source.setdefault(source, [0, 0])
        tally[0] += hit
        tally[1] += n
    out.sources = {k: hit / n for k, (hit, n) in per_source.items() if n}
    for sid, source, n, hit, missed in rates:
        # far below its own source's rate: this sample's final rows are not its own
        base = out.sources[source]
        if n >= min_rows and base >= 0.2 and hit / n < base / 4:
            where = f"source {source!r}" if source else "dump"
            out.low.append(
                f"{sid}: final rows predict the next token at {hit}/{n} sampled rows "
                f"({where}: {base:.0%}); first disagreeing rows {missed[:5]}"
            )
    return out
