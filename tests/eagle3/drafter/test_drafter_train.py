"""Training: metrics lines, exact resume after a stop, torchrun with 2 CPU ranks (gloo)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from remote_agent.eagle3.drafter.train import checkpoint as ckpt
from remote_agent.eagle3.drafter.train import config as config_mod
from remote_agent.eagle3.drafter.train.loop import train
from tests.support.paths import REPO
from tests.support.procs import run_tree

METRIC_KEYS = {
    "step",
    "loss",
    "loss_k",
    "acc_k",
    "sim_accept_len",
    "tokens_per_s",
    "data_wait",
    "lr",
    "grad_norm",
}


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_emits_metrics_and_a_checkpoint(tiny_inputs, tmp_path, capsys, make_config):
    cfg = config_mod.load(make_config(tmp_path / "c.json", tiny_inputs, train={"max_steps": 4}))
    result = train(cfg)
    assert result["steps"] == 4 and result["checkpoint"].endswith("step-00000004")
    err = capsys.readouterr().err
    lines = [
        json.loads(x[len("@@eagle3 ") :]) for x in err.splitlines() if x.startswith("@@eagle3 ")
    ]
    metrics = [r for r in lines if r["kind"] == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert set(metrics[0]) >= METRIC_KEYS
    assert len(metrics[0]["loss_k"]) == 3 and len(metrics[0]["acc_k"]) == 3
    assert all(m["loss"] > 0 and 1.0 <= m["sim_accept_len"] <= 4.0 for m in metrics)


def test_resume_reproduces_the_next_steps_bit_for_bit(tiny_inputs, tmp_path, make_config):
    """Stop after step 5 (mid-epoch, noise on), resume, and compare with an uninterrupted run."""
    common = {"max_steps": 9, "noise_std": 0.05, "epochs": 2, "keep_last": 1}
    data = {"max_tokens": 384}
    a = config_mod.load(
        make_config(
            tmp_path / "a.json",
            tiny_inputs,
            data=data,
            train={**common, "out_dir": str(tmp_path / "A")},
        )
    )
    train(a)
    b_cfg = make_config(
        tmp_path / "b.json",
        tiny_inputs,
        data=data,
        train={**common, "out_dir": str(tmp_path / "B")},
    )
    stopped = train(config_mod.load(b_cfg, ["train.stop_after_step=5"]))
    assert stopped["stopped_early"] and stopped["steps"] == 5
    assert ckpt.latest(tmp_path / "B" / "checkpoints").name == "step-00000005"
    resumed = train(config_mod.load(b_cfg))
    assert resumed["steps"] == 9
    ma, mb = _metrics(tmp_path / "A"), _metrics(tmp_path / "B")
    assert [m["step"] for m in mb] == list(range(1, 10))
    for x, y in zip(ma, mb, strict=True):
        assert x["loss"] == y["loss"] and x["loss_k"] == y["loss_k"], x["step"]
        assert x["grad_norm"] == y["grad_norm"] and x["lr"] == y["lr"]
    sa = ckpt.load(ckpt.latest(tmp_path / "A" / "checkpoints"))
    sb = ckpt.load(ckpt.latest(tmp_path / "B" / "checkpoints"))
    for k, v in sa["model"].items():
        assert torch.equal(v, sb["model"][k]), k
    assert sa["position"] == sb["position"]
    assert len(ckpt.step_dirs(tmp_path / "B" / "checkpoints")) == 1  # pruned to keep_last


def test_host_embedding_trains_bit_for_bit_like_the_device_one(tiny_inputs, tmp_path, make_config):
    """train.embed_on_host (on by default here: frozen embedding, a dump, no FSDP): the drafter
    on the device has no embedding rows at all, the loader gathers them; losses, gradient
    norms and weights are those of the device lookup, bit for bit. Where it cannot apply,
    asking for it is an error."""
    from remote_agent.eagle3.drafter.train.loop import _embed_on_host
    from remote_agent.eagle3.errors import BadInput

    runs = {}
    for name, host in (("host", None), ("device", False)):
        cfg = config_mod.load(
            make_config(
                tmp_path / f"{name}.json", tiny_inputs,
                train={"max_steps": 3, "out_dir": str(tmp_path / name), "embed_on_host": host},
            )
        )  # fmt: skip
        assert _embed_on_host(cfg, 1) is (host is None)
        train(cfg)
        runs[name] = (
            _metrics(tmp_path / name),
            ckpt.load(ckpt.latest(tmp_path / name / "checkpoints")),
        )
    (m_host, s_host), (m_dev, s_dev) = runs["host"], runs["device"]
    assert [(m["loss"], m["grad_norm"]) for m in m_host] == [
        (m["loss"], m["grad_norm"]) for m in m_dev
    ]
    assert s_host["model"].keys() == s_dev["model"].keys()
    for k, v in s_host["model"].items():
        assert torch.equal(v, s_dev["model"][k]), k
    fsdp = config_mod.load(
        make_config(
            tmp_path / "f.json", tiny_inputs, train={"parallel": "fsdp", "embed_on_host": True}
        )
    )
    with pytest.raises(BadInput, match="embed_on_host: not with parallel: fsdp"):
        _embed_on_host(fsdp, 2)
    assert _embed_on_host(fsdp, 1)
    # online takes the same input path as offline (the GPU's matmuls saw other layouts when the
    # two differed); tests/eagle3/online trains it through the stream
    online = config_mod.load(
        make_config(tmp_path / "o.json", tiny_inputs, online={"server": "http://127.0.0.1:9"})
    )
    assert _embed_on_host(online, 1)


def test_resume_refuses_a_different_drafter(tiny_inputs, tmp_path, make_config):
    cfg_path = make_config(tmp_path / "c.json", tiny_inputs, train={"max_steps": 1})
    train(config_mod.load(cfg_path))
    from remote_agent.eagle3.errors import BadInput

    with pytest.raises(BadInput, match="drafter config differs"):
        train(config_mod.load(cfg_path, ["drafter.intermediate_size=64", "train.max_steps=2"]))


def _torchrun(cfg_path: Path, *extra: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "remote_agent.eagle3", "train", "--config", str(cfg_path), *extra]
    proc = run_tree(cmd, timeout=240, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    prefix = "@@eagle3 "
    return [json.loads(x[len(prefix) :]) for x in proc.stderr.splitlines() if x.startswith(prefix)]


def test_torchrun_two_cpu_ranks_ddp_and_fsdp_resume(tiny_inputs, tmp_path, make_config):
    """DDP on 2 gloo ranks; FSDP2 stopped after step 2 and resumed gives the same losses."""
    cfg = make_config(tmp_path / "c.json", tiny_inputs, train={"max_steps": 4})
    lines = _torchrun(cfg, "--out", str(tmp_path / "ddp"))
    results = [r for r in lines if r["kind"] == "result"]
    assert len(results) == 1 and results[0]["world"] == 2 and results[0]["steps"] == 4
    ddp = _metrics(tmp_path / "ddp")
    assert [m["step"] for m in ddp] == [1, 2, 3, 4]
    assert ckpt.load(ckpt.latest(tmp_path / "ddp" / "checkpoints"))["world"] == 2

    fsdp = ["--out", str(tmp_path / "fsdp"), "--set", 'train.parallel="fsdp"']
    _torchrun(cfg, *fsdp, "--stop-after-step", "2")
    _torchrun(cfg, *fsdp)
    sharded = _metrics(tmp_path / "fsdp")
    assert [m["step"] for m in sharded] == [1, 2, 3, 4]
    for a, b in zip(ddp, sharded, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6), a["step"]


def test_mla_drafter_trains_and_exports(tiny_inputs, tmp_path, make_config):
    mla = {
        "arch": "mla",
        "num_attention_heads": 4,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "fc_norm": True,
    }
    cfg = make_config(tmp_path / "c.json", tiny_inputs, drafter=mla, train={"max_steps": 2})
    result = train(config_mod.load(cfg))
    assert result["steps"] == 2
    from remote_agent.eagle3.drafter.export.export import export_checkpoint

    info = export_checkpoint(tmp_path / "run", tmp_path / "export")
    config = json.loads((Path(info["out"]) / "config.json").read_text())
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and config["fc_norm"]


def test_non_finite_gradients_stop_the_run_before_a_checkpoint(tiny_inputs, tmp_path, make_config):
    """A learning rate of 1e30 blows the weights up after the first step, so every later
    backward is NaN: each such step is skipped, and once more than train.max_nonfinite_steps
    were, the run stops with a message naming the first before any checkpoint (due every 2
    steps) holds a blown-up weight."""
    from remote_agent.eagle3.errors import Failed

    for allowed, stop in ((0, 2), (2, 4)):
        run = tmp_path / f"run{allowed}"
        blown = {"max_steps": 6, "save_every": 2, "lr": 1e30, "warmup_steps": 0, "log_every": 3,
                 "out_dir": str(run), "max_nonfinite_steps": allowed}  # fmt: skip
        cfg = make_config(tmp_path / f"b{allowed}.json", tiny_inputs, train=blown)
        want = rf"not finite at step 2 \(\d of the steps up to {stop}, each skipped; .*no chec"
        with pytest.raises(Failed, match=want):
            train(config_mod.load(cfg))
        assert ckpt.step_dirs(run / "checkpoints") == []


def test_a_non_finite_step_is_skipped_whole(tiny_inputs, tmp_path, make_config, monkeypatch):
    """One batch whose gradients are NaN (injected into step 3's backward, as one overflowing
    batch made on the H100) is skipped: the run goes on to its last step, that window's metrics
    line says so and keeps NaN out of its loss, every saved weight is finite. (That a skip moves
    nothing at all is the next test's.)"""
    from remote_agent.eagle3.drafter.train import loop

    real = loop.forward_backward

    def poisoned(ctx, b, step):
        out = real(ctx, b, step)
        if step == 2:  # 0-based: the third step
            for p in ctx.model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
        return out

    monkeypatch.setattr(loop, "forward_backward", poisoned)
    cfg = make_config(tmp_path / "n.json", tiny_inputs, train={"max_steps": 5})
    result = train(config_mod.load(cfg))
    assert result["steps"] == 5
    metrics = _metrics(tmp_path / "run")
    assert [m.get("skipped_nonfinite", 0) for m in metrics] == [0, 0, 1, 0, 0]
    # the skipped step's window (log_every 1) kept nothing: no loss rather than a made-up 0
    assert metrics[2]["loss"] is None and metrics[2]["grad_norm"] is None
    assert all(math.isfinite(m["loss"]) for i, m in enumerate(metrics) if i != 2)
    state = ckpt.load(ckpt.latest(tmp_path / "run" / "checkpoints"))
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert state["model"]


def test_fused_adamw_skips_the_update_where_the_watch_says(tmp_path):
    """The device path (fused AdamW, CPU kernel here as on CUDA): a NaN step moves nothing,
    the next finite step equals the first update of a fresh optimizer."""
    from remote_agent.eagle3.drafter.train.finite import FiniteWatch

    runs = []
    for poison in (True, False):
        w = torch.nn.Parameter(torch.linspace(-1, 1, 8))
        opt = torch.optim.AdamW([w], lr=0.1, fused=True)
        watch = FiniteWatch(torch.device("cpu"), tolerance=1)
        if poison:
            w.grad = torch.full_like(w, float("nan"))
            watch.step(opt, w.grad.norm(), 1)
            assert torch.equal(w.detach(), torch.linspace(-1, 1, 8))
            assert float(opt.state[w]["step"]) == 0.0
        w.grad = torch.arange(8.0)
        watch.step(opt, w.grad.norm(), 2)
        watch.check(2, None)  # one skipped: within the tolerance
        runs.append(w.detach().clone())
    assert torch.equal(runs[0], runs[1])
