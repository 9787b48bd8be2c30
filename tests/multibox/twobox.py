"""Two boxes for real: each in its own network namespace with its own OpenSSH sshd, the CLI in a
third (the hub, tests/multibox/lan.py), and the 2-host runbook of the demo-sized pipeline:
extraction sharded over both boxes, verify-dumps over the union, the drafter trained by
torchrun across both (c10d rendezvous, gloo). Shared by test_two_hosts.py and
bench/bench_multibox.py. The boxes share this machine's filesystem: the dump root and
`train.out` are the "shared storage" of a real two-box setup.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.multibox.lan import Lan
from tests.ssh.helpers import SshCli, host_block
from tests.ssh.sshd import Sshd, cmdline, keygen, tagged_pids

KEEPALIVE = "  ServerAliveInterval 1\n  ServerAliveCountMax 2\n"
RDZV_PORT = 29511


@dataclass
class TwoBoxes:
    lan: Lan
    sshd: list[Sshd]
    key: Path

    @classmethod
    def start(cls, root: Path, tag: str) -> TwoBoxes:
        root.mkdir(parents=True, exist_ok=True)
        lan = Lan(tag, 2).create()
        sshds: list[Sshd] = []
        try:
            key = keygen(root / "id_ed25519")
            for i in range(2):
                sshds.append(
                    Sshd(
                        root / f"sshd{i}",
                        [key.with_suffix(".pub")],
                        root / f"home{i}",
                        uuid.uuid4().hex,
                        address=lan.box_addr[i],
                        port=2222,
                        netns=lan.box_ns[i],
                        client_netns=lan.client_ns,
                    ).start()
                )
        except BaseException:
            for s in sshds:
                s.stop()
            lan.close()
            raise
        return cls(lan, sshds, key)

    def close(self) -> None:
        for s in self.sshd:
            s.stop()
        self.lan.close()

    def cli(self, tmp: Path) -> SshCli:
        known = tmp / "known_hosts"
        known.write_text("".join(s.known_hosts_line() for s in self.sshd))
        config = tmp / "ssh_config"
        config.write_text(
            "".join(
                host_block(f"box{i}", s.address, s.port, self.key, KEEPALIVE)
                for i, s in enumerate(self.sshd)
            )
        )
        return SshCli(tmp, known, config, prefix=self.lan.client_prefix())

    # ---- faults --------------------------------------------------------------------------
    def lose(self, i: int) -> None:
        """Box i drops off the network and its sshd dies; its jobs keep running."""
        self.lan.cut(i)
        proc = self.sshd[i].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGKILL)  # the listener only: sessions and jobs live on
        proc.wait()

    def recover(self, i: int) -> None:
        self.lan.restore(i)
        self.sshd[i].start()

    def kill_jobs(self, i: int, *needles: str) -> list[int]:
        """SIGKILL box i's processes (of this test's sshd) whose command line holds a needle."""
        hit = [p for p in tagged_pids(self.sshd[i].tag) if any(n in cmdline(p) for n in needles)]
        for pid in hit:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return hit


def train_config(path: Path, inputs: dict, out: Path, save_every: int = 3, epochs: int = 3) -> Path:
    cfg = {
        "target": {"path": inputs["target"]},
        "data": {
            "dump": "",
            "dataset": inputs["data"],
            "vocab": inputs["vocab"],
            "max_tokens": 96,
            "prefetch": 2,
            "holdout_fraction": 0.0,
        },
        "drafter": {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64},
        "train": {
            "out_dir": str(out),
            "epochs": epochs,
            "lr": 1e-3,
            "log_every": 1,
            "save_every": save_every,
            "keep_last": 50,
            "ttt_steps": 2,
            "device": "cpu",
        },
    }
    path.write_text(json.dumps(cfg))
    return path


def runbook(
    boxes: TwoBoxes, work: Path, inputs: dict, config: Path, fan: str = "[box0, box1]"
) -> str:
    """The 2-host pipeline (the shape of runbooks/kimi-k25-eagle3-2box.yaml, demo-sized);
    `fan` is the hosts its fan-out steps run on (`[box0]`: the same pipeline on one box)."""
    py = sys.executable
    hosts = "".join(
        f"  box{i}:\n    ssh: box{i}\n    python: {py}\n"
        f"    vars: {{addr: {boxes.lan.box_addr[i]}, nic: {boxes.lan.box_if[i]}}}\n"
        for i in range(2)
    )
    return f"""\
name: twobox
hosts:
{hosts}host: box0
vars:
  work: {work}
  model: {inputs["target"]}
  data: {inputs["data"]}
  dumps: {work}/hidden-states
  run: {work}/drafter-run
  config: {config}
  master: {boxes.lan.box_addr[0]}
  addr: ""
  nic: lo
steps:
  - id: extract
    title: Extract hidden states, one shard per box
    hosts: {fan}
    detach: true
    idempotent: true
    retry: {{max: 2, on: [lost]}}
    env: {{OMP_NUM_THREADS: "1"}}
    run: >-
      python -m remote_agent.eagle3 extract --backend hf --model ${{model}} --dataset ${{data}}
      --allow-no-manifest --out ${{dumps}} --shard ${{host_rank}}/${{host_count}} --device cpu
      --disk-margin-gb 0 --min-free-gb 0 --progress-interval 0.2 --shard-mb 0.02
      --token-budget 64 --max-batch 1
  - id: verify-dumps
    title: Every sample exactly once over the union of the shards
    requires: [extract]
    run: python -m remote_agent.eagle3 verify-dumps ${{dumps}} --dataset ${{data}}
  - id: train
    title: Train the drafter with torchrun across both boxes
    hosts: {fan}
    requires: [verify-dumps]
    detach: true
    env: {{GLOO_SOCKET_IFNAME: "${{nic}}", OMP_NUM_THREADS: "1"}}
    run: >-
      torchrun --nnodes ${{host_count}} --nproc-per-node 1 --rdzv-backend c10d
      --rdzv-endpoint ${{master}}:{RDZV_PORT} --rdzv-id ${{run_id}}
      --rdzv-conf is_host=$([ ${{host_rank}} = 0 ] && echo 1 || echo 0) --local-addr ${{addr}}
      -m remote_agent.eagle3 train --config ${{config}} --set data.dump=${{dumps}} --out ${{run}}
"""


def final_state(run: Path) -> dict:
    import torch

    steps = sorted((run / "checkpoints").glob("step-*"))
    return torch.load(steps[-1] / "state.pt", map_location="cpu", weights_only=False)


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
