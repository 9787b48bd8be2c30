"""The holdout split hashes the base conversation id: the per-turn samples `id#k` written by
`eagle3 tokenize --turns split` (prefixed `source/` by merge) of one conversation all land on
one side, in training's filter (data.is_holdout) and in `eval --split` (load_prompts) alike."""

from __future__ import annotations

import json
from collections import defaultdict

from remote_agent.eagle3.drafter.eval.evaluate import load_prompts
from remote_agent.eagle3.drafter.train.data import conversation_id, is_holdout


def test_turns_of_a_conversation_never_straddle_the_split(tmp_path):
    path = tmp_path / "merged.jsonl"
    rows = []
    for n in range(60):
        for k in range(3):
            rid = f"src/c{n}#{k}"
            # the prompt encodes (n, k) so the prompt tells which record eval picked
            ids = [n + 10, k + 1, 7, 8]
            rows.append({"id": rid, "source": "src", "input_ids": ids, "loss_mask": [0, 0, 1, 1]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    side = defaultdict(set)
    for split in ("holdout", "train"):
        for p in load_prompts(path, 10_000, 0.3, split):
            side[p[0] - 10].add(split)
    assert all(len(s) == 1 for s in side.values()) and len(side) == 60
    held = {n for n, s in side.items() if s == {"holdout"}}
    assert 5 < len(held) < 35  # about 30 % of the conversations
    for n in range(60):  # training's filter agrees with eval's, turn by turn
        assert {is_holdout(f"src/c{n}#{k}", 0.3) for k in range(3)} == {n in held}
    assert conversation_id("src/c1#2") == "src/c1"
