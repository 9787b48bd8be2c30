"""A producer is refused at its HELLO when it serves another model, other layers or shapes
(online/listener.hello_problems): a seeded loop over every identity field."""

from __future__ import annotations

import random
from dataclasses import asdict

from remote_agent.eagle3.dense import DumpMeta
from remote_agent.eagle3.online.listener import hello_problems

META = DumpMeta("kimi", 7168, 61, [2, 30, 58], producer="sglang-patch")
IDENT = {"config_sha256": "c" * 64, "tokenizer_sha256": "t" * 64, "weights_sha256": "w" * 64}
EXPECT = {"hidden_size": 7168, "num_layers": 61, "aux_layer_ids": [2, 30, 58]}


def hello(meta=META, identity=None):
    return {"meta": asdict(meta), "identity": dict(IDENT if identity is None else identity)}


def test_the_right_producer_is_accepted_and_may_state_less():
    assert hello_problems(hello(), EXPECT, IDENT) == []
    assert hello_problems(hello(identity={"config_sha256": "c" * 64}), EXPECT, IDENT) == []


def test_every_mismatch_is_refused_with_its_reason(tally):
    rng = random.Random(33)
    cases = [
        ({**asdict(META), "hidden_size": 4096}, IDENT, "hidden_size"),
        ({**asdict(META), "num_layers": 60}, IDENT, "num_layers"),
        ({**asdict(META), "aux_layer_ids": [1, 29, 57]}, IDENT, "aux_layer_ids"),
        ({**asdict(META), "final_norm": "pre"}, IDENT, "final_norm"),
        ({**asdict(META), "aux_dtype": "fp4"}, IDENT, "aux_dtype"),
        (asdict(META), {**IDENT, "config_sha256": None}, "config_sha256"),
    ]
    for key in ("config_sha256", "tokenizer_sha256", "weights_sha256"):
        for _ in range(5):
            other = "".join(rng.choice("0123456789abcdef") for _ in range(64))
            cases.append((asdict(META), {**IDENT, key: other}, key))
    for meta, identity, word in cases:
        problems = hello_problems({"meta": meta, "identity": identity}, EXPECT, IDENT)
        held = bool(problems) and word in " ".join(problems) and "kimi" in problems[0]
        assert tally.trial("online stream: wrong producer refused at HELLO", held), (word, problems)
