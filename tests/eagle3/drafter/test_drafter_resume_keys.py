"""Resume loads the drafter non-strictly only because the frozen shared embedding is left out of
checkpoints; any other missing or extra tensor is refused, not silently left at its init."""

from __future__ import annotations

import pytest
import torch

from remote_agent.eagle3.drafter.train import checkpoint as ckpt
from remote_agent.eagle3.drafter.train import config as config_mod
from remote_agent.eagle3.drafter.train.loop import train
from remote_agent.eagle3.errors import Failed


@pytest.mark.parametrize("damage", ["drop fc.weight", "add stray.weight"])
def test_resume_refuses_a_checkpoint_missing_or_adding_tensors(
    tiny_inputs, tmp_path, make_config, damage
):
    cfg = make_config(tmp_path / "c.json", tiny_inputs, train={"max_steps": 3})
    train(config_mod.load(cfg, ["train.stop_after_step=1"]))
    last = ckpt.latest(tmp_path / "run" / "checkpoints")
    state = torch.load(last / "state.pt", weights_only=False)
    assert "embed_tokens.weight" not in state["model"]  # the one legitimate absence
    if damage.startswith("drop"):
        del state["model"]["fc.weight"]
    else:
        state["model"]["stray.weight"] = torch.zeros(1)
    torch.save(state, last / "state.pt")
    with pytest.raises(Failed, match="fc.weight" if damage.startswith("drop") else "stray"):
        train(config_mod.load(cfg))
