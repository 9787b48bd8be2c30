"""Torch reference speculative decoder: chain drafting, greedy verification, SGLang's accounting.

Per round (topk 1, `steps` draft tokens, draft_tokens = steps + 1 verified at once):

    1. the drafter drafts d_1..d_steps from the target's aux states of the verified context and
       the newest (bonus) token b (Eagle3Drafter.draft_chain);
    2. the target runs once over context + b + d_1..d_steps (one verify step);
    3. the longest prefix of drafts equal to the target's greedy tokens is accepted, plus one
       bonus token from the target at the first mismatch (or after the last draft).

Acceptance length = completion tokens / verify steps (SGLang's spec_accept_length; the bonus is
included, so 1.0 means nothing was accepted). The target keeps a KV cache of the verified tokens
(each verify step runs it on the bonus and drafts only; rejected drafts are cropped off);
`speculative_decode(..., cached=False)` recomputes the full sequence each round instead (the
transparent reference; tests/eagle3/drafter/test_drafter_eval.py checks both give the same tokens
and acceptance). `eagle3 eval` decodes `--batch` prompts at once (speculative_decode_batch: one
target forward and one host sync per round for the whole batch, rejected drafts masked rather than
cropped; per prompt the same tokens and acceptance as the one-prompt decoder, tested).

Losslessness: the output must equal plain greedy decoding of the target. Checked in one forward
over prompt + output: a sequence is the greedy decode exactly when every token is the argmax of
the target given its prefix (and it stops at EOS or the length limit). `--reference full` also
runs the token-by-token greedy decoder and compares the sequences. A mismatch is reported with
the target's top-2 logit margin at that position (a near-tie is numerical, not a logic error).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from remote_agent.eagle3.drafter.eval.teacher_forced import Forced, teacher_forced
from remote_agent.eagle3.drafter.model.contract import resolve_capture_ids


@dataclass
class Decode:
    tokens: list[int]
    verify_steps: int
    accepted_at: list[int]  # accepted_at[k] = verify steps that accepted >= k+1 drafts
    seconds: float


@dataclass
class PromptResult:
    prompt_tokens: int
    spec: Decode
    lossless: bool
    mismatch_at: int | None = None
    margin: float | None = None
    reference_equal: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Target:
    """The HF target: `target(ids)` is a full forward (logits and the drafter's aux features of
    every position); `extend(ids)` appends to a KV cache and returns those of the new tokens
    only, `keep(n)` drops the cache past n tokens (the rejected drafts), `reset()` empties it."""

    def __init__(self, model, aux_hidden_ids: list[int]) -> None:
        self.model = model
        self.aux_ids = aux_hidden_ids
        self.device = next(model.parameters()).device
        self.cache = None

    def _outputs(self, out):
        hs = out.hidden_states
        aux = torch.cat([hs[i][0] for i in self.aux_ids], dim=-1)
        return out.logits[0].float(), aux

    @torch.no_grad()
    def __call__(self, ids: list[int]):
        out = self.model(torch.tensor([ids], device=self.device), output_hidden_states=True)
        return self._outputs(out)

    @torch.no_grad()
    def extend(self, ids: list[int]):
        if self.cache is None:
            from transformers import DynamicCache

            self.cache = DynamicCache()
        out = self.model(
            torch.tensor([ids], device=self.device), past_key_values=self.cache, use_cache=True,
            output_hidden_states=True,
        )  # fmt: skip
        self.cache = out.past_key_values
        return self._outputs(out)

    def keep(self, n: int) -> None:
        assert self.cache is not None  # keep follows a prefill or an extend
        drop = self.cache.get_seq_length() - n
        if drop > 0:  # a negative crop removes that many tokens in every transformers version;
            self.cache.crop(-drop)  # a positive one (keep n) is deprecated from 5.17, gone in 5.18

    def reset(self) -> None:
        self.cache = None


def accept(drafts: list[int], greedy: list[int], accepted_at: list[int]) -> int:
    """How many leading drafts equal the target's greedy tokens (counted into accepted_at by
    chain position); greedy[a] is then the bonus token."""
    a = 0
    while a < len(drafts) and drafts[a] == greedy[a]:
        accepted_at[a] += 1
        a += 1
    return a


def speculative_decode(
    target: Target, drafter, prompt: list[int], max_new: int, steps: int, eos: frozenset[int],
    cached: bool = True,
) -> Decode:  # fmt: skip
    """The speculative decode of `prompt`; cached: the target's KV cache carries the verified
    tokens from round to round (each verify step runs the target on the bonus and the drafts
    only, the rejected drafts are cropped off), else the target recomputes the whole sequence
    every round (the transparent reference: same tokens and acceptance, tested)."""
    if cached:
        return _decode_cached(target, drafter, prompt, max_new, steps, eos)
    t0 = time.perf_counter()
    logits, aux = target(prompt)  # prefill: its greedy token is the first output
    seq = list(prompt)
    out: list[int] = []
    bonus = int(logits[-1].argmax())
    out.append(bonus)
    verify = 0
    accepted_at = [0] * steps
    while len(out) < max_new and out[-1] not in eos:
        drafts = drafter.draft_chain(aux, torch.tensor(seq + [bonus], device=aux.device), steps)
        logits, aux_all = target(seq + [bonus] + drafts)
        verify += 1
        base = len(seq)  # logits[base + i] predicts the token after (bonus, d_1..d_i)
        greedy = logits[base : base + steps + 1].argmax(-1).tolist()
        a = accept(drafts, greedy, accepted_at)
        new = drafts[:a] + [greedy[a]]
        seq = seq + [bonus] + drafts[:a]
        aux = aux_all[: len(seq)]
        bonus = new[-1]
        for t in new:
            if len(out) >= max_new or out[-1] in eos:
                break
            out.append(t)
    return Decode(out, verify, accepted_at, time.perf_counter() - t0)


def _decode_cached(target: Target, drafter, prompt, max_new, steps, eos) -> Decode:
    t0 = time.perf_counter()
    target.reset()
    logits, aux = target.extend(list(prompt))  # prefill: its greedy token is the first output
    seq = list(prompt)
    bonus = int(logits[-1].argmax())
    out = [bonus]
    verify = 0
    accepted_at = [0] * steps
    kept: dict = {}  # the drafter's step-0 keys and values of the verified context
    while len(out) < max_new and out[-1] not in eos:
        ids = torch.tensor(seq + [bonus], device=aux.device)
        drafts = _draft(drafter, aux, ids, steps, kept)
        logits, new_aux = target.extend([bonus] + drafts)  # row i: the token after d_i
        verify += 1
        greedy = logits[: steps + 1].argmax(-1).tolist()  # one host sync per verify step
        a = accept(drafts, greedy, accepted_at)
        target.keep(len(seq) + 1 + a)  # bonus and accepted drafts stay, the rest is dropped
        seq = seq + [bonus] + drafts[:a]
        aux = torch.cat([aux, new_aux[: 1 + a]])
        bonus = greedy[a]
        for t in drafts[:a] + [bonus]:
            if len(out) >= max_new or out[-1] in eos:
                break
            out.append(t)
    target.reset()
    return Decode(out, verify, accepted_at, time.perf_counter() - t0)


class BatchTarget:
    """The target decoding several prompts at once, one forward per verify round for all of
    them: prompts are left-padded, every row extends by the same 1 + steps tokens a round, and a
    row's rejected drafts stay in the KV cache masked out (attention_mask 0) instead of cropped,
    with explicit position ids so each row's positions stay its own. `valid[b, j]`: cache entry j
    is part of row b's verified sequence."""

    def __init__(self, model, aux_hidden_ids: list[int]) -> None:
        self.model = model
        self.aux_ids = aux_hidden_ids
        self.device = next(model.parameters()).device
        self.cache: Any = None
        self.valid = torch.zeros(0, 0, dtype=torch.long)
        self.lengths = torch.zeros(0, dtype=torch.long)

    @torch.no_grad()
    def _forward(self, ids: torch.Tensor, positions: torch.Tensor):
        out = self.model(
            ids, attention_mask=self.valid, position_ids=positions, past_key_values=self.cache,
            use_cache=True, output_hidden_states=True,
        )  # fmt: skip
        self.cache = out.past_key_values
        hs = out.hidden_states
        return out.logits.float(), torch.cat([hs[i] for i in self.aux_ids], dim=-1)

    def prefill(self, prompts: list[list[int]]):
        """Logits and aux [B, P, ...] of the left-padded prompts (row b's own tokens are its
        last len(prompts[b]) positions)."""
        from transformers import DynamicCache

        width = max(len(p) for p in prompts)
        pad = [width - len(p) for p in prompts]
        ids = torch.tensor([[p[0]] * n + p for p, n in zip(prompts, pad, strict=True)])
        self.valid = (torch.arange(width)[None, :] >= torch.tensor(pad)[:, None]).long()
        positions = (self.valid.cumsum(-1) - 1).clamp(min=0)
        self.lengths = torch.tensor([len(p) for p in prompts])
        self.cache = DynamicCache()
        self.valid = self.valid.to(self.device)
        return self._forward(ids.to(self.device), positions.to(self.device))

    def extend(self, ids: torch.Tensor):
        """Every row appends ids [B, n] after its verified sequence."""
        n = ids.shape[1]
        positions = self.lengths[:, None] + torch.arange(n)[None, :]
        self.valid = torch.cat([self.valid, torch.ones_like(self.valid[:, :n])], dim=1)
        return self._forward(ids.to(self.device), positions.to(self.device))

    def keep(self, row: int, n_new: int, appended: int) -> None:
        """Row `row` keeps the first n_new of the `appended` tokens just extended."""
        if n_new < appended:
            self.valid[row, self.valid.shape[1] - appended + n_new :] = 0
        self.lengths[row] += n_new

    def reset(self) -> None:
        self.cache = None


def speculative_decode_batch(
    target: BatchTarget, drafter, prompts: list[list[int]], max_new: int, steps: int,
    eos: frozenset[int],
) -> list[Decode]:  # fmt: skip
    """`speculative_decode` of several prompts at once: the same tokens and acceptance per
    prompt (tested against it), one target forward and one host sync per round for the whole
    batch instead of one each per prompt. The drafter still drafts each row's chain (its kept
    step-0 keys are per row); a finished row rides along masked out until all are done."""
    t0 = time.perf_counter()
    logits, aux_all = target.prefill(prompts)
    width = aux_all.shape[1]
    firsts = logits[:, -1].argmax(-1).tolist()
    rows = len(prompts)
    aux = [aux_all[b, width - len(p) :] for b, p in enumerate(prompts)]
    seqs = [list(p) for p in prompts]
    outs = [[f] for f in firsts]
    bonus = list(firsts)
    verify = [0] * rows
    accepted = [[0] * steps for _ in range(rows)]
    kept: list[dict] = [{} for _ in range(rows)]

    def done(b: int) -> bool:
        return len(outs[b]) >= max_new or outs[b][-1] in eos

    while not all(done(b) for b in range(rows)):
        live = [b for b in range(rows) if not done(b)]
        drafts = {}
        for b in live:
            ids = torch.tensor(seqs[b] + [bonus[b]], device=aux[b].device)
            drafts[b] = _draft(drafter, aux[b], ids, steps, kept[b])
        block = [[bonus[b]] + drafts.get(b, [bonus[b]] * steps) for b in range(rows)]
        logits, new_aux = target.extend(torch.tensor(block))
        greedy = logits.argmax(-1).tolist()  # one host sync per round, all rows
        for b in range(rows):
            if b not in drafts:
                target.keep(b, 0, steps + 1)  # a finished row: nothing of this round counts
                continue
            verify[b] += 1
            a = accept(drafts[b], greedy[b], accepted[b])
            target.keep(b, 1 + a, steps + 1)
            seqs[b] += [bonus[b]] + drafts[b][:a]
            aux[b] = torch.cat([aux[b], new_aux[b, : 1 + a]])
            bonus[b] = greedy[b][a]
            for t in drafts[b][:a] + [bonus[b]]:
                if done(b):
                    break
                outs[b].append(t)
    target.reset()
    share = (time.perf_counter() - t0) / rows  # the batch's wall time, split evenly
    return [Decode(outs[b], verify[b], accepted[b], share) for b in range(rows)]


def _draft(drafter, aux, ids, steps: int, kept: dict) -> list[int]:
    """The drafter's chain, with its kept step-0 keys when it takes them (Eagle3Drafter; the
    scripted drafters of tests take none)."""
    import inspect

    if "cache" in inspect.signature(drafter.draft_chain).parameters:
        return drafter.draft_chain(aux, ids, steps, cache=kept)
    return drafter.draft_chain(aux, ids, steps)


@torch.no_grad()
def check_greedy(
    target: Target, prompt: list[int], output: list[int], max_new: int, eos: frozenset[int]
):
    """(ok, first bad index, top-2 margin there): is `output` the target's greedy decode?"""
    logits, _ = target(prompt + output)
    pred = logits[len(prompt) - 1 : len(prompt) - 1 + len(output)]
    greedy = pred.argmax(-1).tolist()
    for i, (g, t) in enumerate(zip(greedy, output, strict=True)):
        if g != t:
            top = pred[i].topk(2).values
            return False, i, float(top[0] - top[1])
        if t in eos and i != len(output) - 1:
            return False, i, None  # continued past EOS
    stopped = len(output) == max_new or bool(output and output[-1] in eos)
    return stopped, (None if stopped else len(output)), None


def load_prompts(
    data: Path, n: int, holdout_fraction: float = 0.0, split: str = "all"
) -> list[list[int]]:
    """Prompts = each record's tokens before its first supervised (assistant) token."""
    from remote_agent.eagle3.data.records import iter_records
    from remote_agent.eagle3.drafter.train.data import is_holdout

    prompts = []
    for _, _, rec in iter_records(Path(data)):
        if split == "holdout" and not is_holdout(rec.id, holdout_fraction):
            continue
        if split == "train" and is_holdout(rec.id, holdout_fraction):
            continue
        first = next((i for i, m in enumerate(rec.loss_mask) if m), None)
        if first is None or first == 0:
            continue
        prompts.append(rec.input_ids[:first])
        if len(prompts) >= n:
            break
    return prompts


def untrained_like(drafter, target_lm_head: torch.Tensor, seed: int = 0, std: float = 0.02):
    """A drafter as training starts it (same init) for the before/after comparison."""
    from remote_agent.eagle3.drafter.model.model import Eagle3Drafter

    fresh = Eagle3Drafter(drafter.config)
    fresh.init_weights(std, torch.Generator().manual_seed(seed))
    fresh.set_vocab(drafter.d2t.cpu(), drafter.t2d.cpu())
    with torch.no_grad():
        fresh.lm_head.weight.copy_(target_lm_head.float().cpu()[fresh.draft_ids()])
    dev = next(drafter.parameters()).device
    return fresh.to(dev, next(drafter.parameters()).dtype)


def run_eval(
    target_dir: Path,
    drafter_dir: Path,
    data: Path,
    num_prompts: int = 8,
    max_new_tokens: int = 64,
    steps: int = 3,
    topk: int = 1,
    draft_tokens: int = 4,
    device: str = "cpu",
    dtype: str = "fp32",
    split: str = "all",
    holdout_fraction: float = 0.0,
    compare_untrained: bool = False,
    reference: str = "forward",
    seed: int = 0,
    batch: int = 16,
) -> dict[str, Any]:
    from remote_agent.eagle3.drafter.eval.synthetic import end_ids, load_target, text_config
    from remote_agent.eagle3.drafter.export.export import load_export
    from remote_agent.eagle3.errors import BadInput

    if topk != 1:
        raise BadInput("--topk: the reference decoder drafts chains (topk 1) only")
    if batch < 1:
        raise BadInput(f"--batch must be at least 1, not {batch}")
    if draft_tokens != steps + 1:
        raise BadInput(f"--draft-tokens must be steps + 1 = {steps + 1} for chain drafting")
    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model, tok = load_target(Path(target_dir), device, tdtype)
    drafter, config = load_export(Path(drafter_dir), device, tdtype)
    tc = text_config(model)
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    aux_hidden = resolve_capture_ids(ids, tc.num_hidden_layers)  # what SGLang would capture
    embed = model.get_input_embeddings().weight
    if config["hidden_size"] == config["target_hidden_size"]:
        with torch.no_grad():
            drafter.embed_tokens.weight.copy_(embed.to(drafter.embed_tokens.weight.dtype))
    drafters = {"trained": drafter}
    if compare_untrained:
        base = untrained_like(drafter, model.get_output_embeddings().weight, seed)
        base.embed_tokens.weight.data.copy_(drafter.embed_tokens.weight.data)
        drafters["untrained"] = base
    target = Target(model, aux_hidden)
    prompts = load_prompts(Path(data), num_prompts, holdout_fraction, split)
    if not prompts:
        raise BadInput(f"{data}: no prompts (records need a supervised span after some context)")
    eos = end_ids(Path(target_dir), tok)
    report: dict[str, Any] = {
        "target": str(target_dir),
        "drafter": str(drafter_dir),
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "steps": steps,
        "topk": topk,
        "draft_tokens": draft_tokens,
        "aux_hidden_ids": aux_hidden,
        "device": device,
        "dtype": dtype,
        "reference": reference,
        "batch": batch,
    }
    references: dict[int, list[int]] = {}
    batched = BatchTarget(model, aux_hidden)
    for name, dr in drafters.items():
        dr.eval()
        decodes: list[Decode] = []
        for lo in range(0, len(prompts), batch):
            decodes += speculative_decode_batch(
                batched, dr, prompts[lo : lo + batch], max_new_tokens, steps, eos
            )
        results = []
        for i, (p, dec) in enumerate(zip(prompts, decodes, strict=True)):
            ok, bad, margin = check_greedy(target, p, dec.tokens, max_new_tokens, eos)
            res = PromptResult(len(p), dec, ok, bad, margin)
            res.extra["forced"] = teacher_forced(target, dr, p, dec.tokens, steps)
            if reference == "full":
                if i not in references:
                    from remote_agent.eagle3.drafter.eval.synthetic import greedy

                    references[i] = greedy(model, p, max_new_tokens, eos)
                res.reference_equal = references[i] == dec.tokens
                res.lossless = res.lossless and res.reference_equal
            results.append(res)
        report[name] = summarize(results, steps)
    return report


def summarize(results: list[PromptResult], steps: int) -> dict[str, Any]:
    completion = sum(len(r.spec.tokens) for r in results)
    verify = sum(r.spec.verify_steps for r in results)
    accepted = [sum(r.spec.accepted_at[k] for r in results) for k in range(steps)]
    seconds = sum(r.spec.seconds for r in results)
    cond = []
    for k in range(steps):
        reached = verify if k == 0 else accepted[k - 1]
        cond.append(round(accepted[k] / reached, 4) if reached else None)
    bad = [
        {"prompt": i, "token": r.mismatch_at, "margin": r.margin}
        for i, r in enumerate(results)
        if not r.lossless
    ]
    return {
        "accept_length": round(completion / verify, 4) if verify else None,
        "completion_tokens": completion,
        "verify_steps": verify,
        "accepted_at_position": [round(a / verify, 4) if verify else None for a in accepted],
        "accept_rate_conditional": cond,
        "lossless": not bad,
        "mismatches": bad,
        "tokens_per_s": round(completion / seconds, 1) if seconds else None,
        "per_prompt_accept_length": [
            round(len(r.spec.tokens) / r.spec.verify_steps, 3) if r.spec.verify_steps else None
            for r in results
        ],
        # the training-time simulation on these same output tokens (teacher_forced.py)
        "teacher_forced": forced_summary(results),
    }


def forced_summary(results: list[PromptResult]) -> dict[str, Any]:
    total = Forced()
    for r in results:
        if "forced" in r.extra:
            total.add(r.extra["forced"])
    return total.summary()
