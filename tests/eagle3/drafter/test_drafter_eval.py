"""The reference speculative decoder: losslessness on the tiny target and SGLang's accounting."""

from __future__ import annotations

import json

import torch

from remote_agent.eagle3.cli import main
from remote_agent.eagle3.drafter.eval.evaluate import (
    Target,
    check_greedy,
    load_prompts,
    speculative_decode,
)
from remote_agent.eagle3.drafter.eval.synthetic import greedy, load_target, random_drafter


class ScriptedDrafter:
    """Proposes a fixed continuation (oracle) or always-wrong tokens."""

    def __init__(self, reference: list[int], prompt_len: int, wrong: bool, vocab: int) -> None:
        self.reference, self.prompt_len, self.wrong, self.vocab = (
            reference,
            prompt_len,
            wrong,
            vocab,
        )

    def draft_chain(self, aux, ids, steps):
        done = len(ids) - self.prompt_len  # output tokens already known (incl. the bonus)
        nxt = self.reference[done : done + steps]
        nxt += [0] * (steps - len(nxt))
        return [(t + 1) % self.vocab for t in nxt] if self.wrong else nxt


def test_sglang_accept_length_formula_with_oracle_and_wrong_drafters(tiny_target):
    model, tok = load_target(tiny_target)
    target = Target(model, [2, 4, 5])
    prompt = load_prompts_from_text(tok)
    ref = greedy(model, prompt, 13, frozenset())
    oracle = speculative_decode(
        target, ScriptedDrafter(ref, len(prompt), False, 2048), prompt, 13, 3, frozenset()
    )
    assert oracle.tokens == ref
    # 1 token from prefill, then 4 per verify step (3 accepted + bonus): 1 + 3 * 4 = 13
    assert oracle.verify_steps == 3 and oracle.accepted_at == [3, 3, 3]
    wrong = speculative_decode(
        target, ScriptedDrafter(ref, len(prompt), True, 2048), prompt, 13, 3, frozenset()
    )
    assert wrong.tokens == ref
    assert wrong.verify_steps == 12 and wrong.accepted_at == [0, 0, 0]  # bonus only: 13 / 12


def load_prompts_from_text(tok) -> list[int]:
    msgs = [{"role": "user", "content": "def add(a, b):\n    return a + b\n"}]
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_check_greedy_detects_a_non_greedy_token(tiny_target):
    model, tok = load_target(tiny_target)
    target = Target(model, [2, 4, 5])
    prompt = load_prompts_from_text(tok)
    ref = greedy(model, prompt, 8, frozenset())
    assert check_greedy(target, prompt, ref, 8, frozenset())[0]
    bad = ref[:4] + [(ref[4] + 1) % 2048] + ref[5:]
    ok, at, margin = check_greedy(target, prompt, bad, 8, frozenset())
    assert not ok and at == 4 and margin > 0


def test_train_export_eval_end_to_end_is_lossless(tiny_inputs, tmp_path, make_config, capsys):
    cfg = make_config(tmp_path / "c.json", tiny_inputs, train={"max_steps": 6, "log_every": 3})
    assert main(["train", "--config", str(cfg)]) == 0
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "export")]) == 0
    out = tmp_path / "eval.json"
    rc = main(
        [
            "eval",
            "--target",
            tiny_inputs["target"],
            "--drafter",
            str(tmp_path / "export"),
            "--data",
            tiny_inputs["data"],
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "16",
            "--compare-untrained",
            "--reference",
            "full",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    for name in ("trained", "untrained"):
        r = report[name]
        assert r["lossless"] and not r["mismatches"]
        assert r["completion_tokens"] == 32
        assert r["accept_length"] == round(r["completion_tokens"] / r["verify_steps"], 4)
        assert len(r["accepted_at_position"]) == 3
    assert report["aux_hidden_ids"] == [2, 4, 5]


def test_prompts_stop_before_the_first_supervised_token(tiny_inputs):
    prompts = load_prompts(tiny_inputs["data"], 3)
    first = json.loads(open(tiny_inputs["data"]).readline())
    cut = first["loss_mask"].index(1)
    assert prompts[0] == first["input_ids"][:cut]
    assert torch.tensor(prompts[0]).numel() > 0


def test_decoding_stops_on_every_end_id_of_the_generation_config(tiny_target, tmp_path):
    """Kimi ends turns with <|im_end|>, [EOS] or [EOT] (generation_config.json lists them all);
    the tokenizer's eos_token_id names only one. Decoding must stop on each."""
    from remote_agent.eagle3.drafter.eval.synthetic import end_ids

    model, tok = load_target(tiny_target)
    target = Target(model, [2, 4, 5])
    prompt = load_prompts_from_text(tok)
    ref = greedy(model, prompt, 12, frozenset())
    stop = ref[5]  # pretend the 6th greedy token is one of the end ids
    kimi = tmp_path / "kimi"
    kimi.mkdir()
    eos = tok.eos_token_id
    (kimi / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, stop]}))
    (kimi / "config.json").write_text(json.dumps({"text_config": {"eos_token_id": 7}}))
    ids = end_ids(kimi, tok)
    assert ids == {eos, stop, 7}
    cut = ref[: ref.index(stop) + 1]
    assert greedy(model, prompt, 12, ids) == cut
    dec = speculative_decode(
        target, ScriptedDrafter(ref, len(prompt), False, 2048), prompt, 12, 3, ids
    )
    assert dec.tokens == cut
    assert check_greedy(target, prompt, cut, 12, ids)[0]
    assert not check_greedy(target, prompt, ref, 12, ids)[0]  # continued past an end id


class FlakyDrafter(ScriptedDrafter):
    """Right on most positions, wrong on every `period`-th output token: partial accepts of
    every length, so the KV cache is cropped at every place a chain can end."""

    def __init__(self, reference, prompt_len, vocab, period: int) -> None:
        super().__init__(reference, prompt_len, False, vocab)
        self.period = period

    def draft_chain(self, aux, ids, steps):
        done = len(ids) - self.prompt_len
        out = super().draft_chain(aux, ids, steps)
        return [
            (t + 1) % self.vocab if (done + i) % self.period == 0 else t for i, t in enumerate(out)
        ]


def test_cached_decode_equals_the_full_recompute(tiny_target):
    """The KV-cached decoder (the default; the drafter keeps its step-0 keys too) gives the
    full-recompute reference's tokens, verify steps and acceptance by position: scripted
    drafters rejected at every chain position, and a real drafter (random layer, the target's
    embedding and head)."""
    model, tok = load_target(tiny_target)
    target = Target(model, [2, 4, 5])
    prompt = load_prompts_from_text(tok)
    ref = greedy(model, prompt, 40, frozenset())
    drafters = [FlakyDrafter(ref, len(prompt), 2048, p) for p in (2, 3, 5)]
    drafters.append(random_drafter(model, [2, 4, 5]))
    seen_partial = set()
    for dr in drafters:
        fast = speculative_decode(target, dr, prompt, 40, 3, frozenset())
        slow = speculative_decode(target, dr, prompt, 40, 3, frozenset(), cached=False)
        assert fast.tokens == slow.tokens
        assert (fast.verify_steps, fast.accepted_at) == (slow.verify_steps, slow.accepted_at)
        assert fast.tokens == ref[: len(fast.tokens)]  # lossless
        seen_partial.update(fast.accepted_at)
    assert len(seen_partial) > 2  # several acceptance profiles were exercised
    assert target.cache is None  # nothing left behind between prompts


def test_rejected_drafts_leave_the_cache_with_a_negative_crop(tiny_target, monkeypatch):
    """transformers 5.17 deprecates `crop(keep)` (a positive length; gone in 5.18): the cache
    drops rejected drafts with `crop(-removed)`, which every version reads the same."""
    from transformers.cache_utils import DynamicLayer

    seen: list[int] = []
    real = DynamicLayer.crop

    def recording(self, tokens_to_remove):
        seen.append(tokens_to_remove)
        return real(self, tokens_to_remove)

    monkeypatch.setattr(DynamicLayer, "crop", recording)
    model, tok = load_target(tiny_target)
    target = Target(model, [2, 4, 5])
    prompt = load_prompts_from_text(tok)
    target.extend(prompt)
    target.keep(len(prompt) - 3)
    assert target.cache is not None and target.cache.get_seq_length() == len(prompt) - 3
    target.keep(len(prompt) - 3)  # nothing to drop: no call
    ref = greedy(model, prompt, 20, frozenset())
    speculative_decode(target, FlakyDrafter(ref, len(prompt), 2048, 2), prompt, 20, 3, frozenset())
    assert seen and all(n < 0 for n in seen), seen


class PrefixOracle:
    """Drafts each prompt's greedy continuation (found by its prompt prefix), wrong on every
    `period`-th output token, the period differing per prompt: rows of one batch accept
    differently and finish at different rounds."""

    def __init__(self, refs: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        self.refs, self.vocab = refs, vocab

    def draft_chain(self, aux, ids, steps):
        ids = ids.tolist()
        for n, (prompt, ref) in enumerate(self.refs.items()):
            if tuple(ids[: len(prompt)]) == prompt:
                done, period = len(ids) - len(prompt), 2 + n
                nxt = (ref[done : done + steps] + [0] * steps)[:steps]
                return [(t + 1) % self.vocab if (done + i) % period == 0 else t
                        for i, t in enumerate(nxt)]  # fmt: skip
        raise AssertionError("unknown prompt")


def test_batched_decode_equals_one_prompt_at_a_time(tiny_target):
    """The batched decoder (left-padded prompts, rejected drafts masked in the KV cache, one
    forward per round for all rows) gives every prompt the tokens, verify steps and acceptance
    by position of the one-prompt decoder: prompts of different lengths, a row that stops early
    on an end id, scripted partial accepts and a real drafter."""
    from remote_agent.eagle3.drafter.eval.evaluate import BatchTarget, speculative_decode_batch

    model, _ = load_target(tiny_target)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (5, 17, 9, 30)]
    refs = {tuple(p): greedy(model, p, 40, frozenset()) for p in prompts}
    stop = frozenset({refs[tuple(prompts[2])][11]})  # row 2 ends at its 12th token
    for dr in (PrefixOracle(refs, 2048), random_drafter(model, [2, 4, 5])):
        batch = speculative_decode_batch(BatchTarget(model, [2, 4, 5]), dr, prompts, 40, 3, stop)
        profiles = set()
        for p, got in zip(prompts, batch, strict=True):
            one = speculative_decode(Target(model, [2, 4, 5]), dr, p, 40, 3, stop)
            assert got.tokens == one.tokens
            assert (got.verify_steps, got.accepted_at) == (one.verify_steps, one.accepted_at)
            profiles.add(tuple(got.accepted_at))
        assert len(batch[2].tokens) < len(batch[0].tokens) == 40  # one row finished early
        if isinstance(dr, PrefixOracle):
            assert len(profiles) == len(prompts)  # every row accepted differently
