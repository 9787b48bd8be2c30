"""Bench: long-context drafter training on one H200, ours vs SpecForge 0.2.0 in the same run.

Issue 17. The Kimi-K2.5-shaped drafter of bench_train / bench_specforge (Llama drafter, hidden
7168, 64 heads x 112, MLP 18,432, target vocab 163,840 -> draft vocab 32,000, 3 aux layers,
TTT 7), synthetic hidden states made on the GPU (one document, every position supervised, every
teacher argmax drafted), each trainer's full step (teacher, TTT unroll, loss, backward, clip,
optimizer). Every side runs in child processes of its own (long_context_trials.py), so compile
caches and peak-memory counters (reset per trial) never mix; each child writes its record after
every phase, so one cut by the budget still says where it was.

ONE call, `--budget-s` (default 530) for everything, parts in priority order:

  equal_work_4k       one 4,096-token sequence: tokens/s and peak memory of ours (the plain
                      unroll, every memory option off), ours_mid (the trainer's defaults:
                      cast_weights_once, recompute_elementwise, compile_loss, embed_once,
                      embed_on_host, shard_tokens), ours_lean (+ per-step checkpointing) and
                      SpecForge,
                      with ratios and which set meets issue 27's goal (>= 1.2x SpecForge's
                      tokens/s at <= 0.8x its memory). Children run
                      side by side while they start and compile (SpecForge's compile is the long
                      pole: see below), as GPU memory allows (expected peaks, EXPECTED_GB, summed
                      under ADMIT_GB); each times its steps with the GPU to itself (gpu_gate.py:
                      the others paused by SIGSTOP, so no kernels and no compile work overlap a
                      timed step). Must end by EQUAL_SHARE of the budget.
  max_seq             per side a ladder of lengths then probes from the fitted memory (peak =
                      a + b x length: the next probe is the predicted longest fit) in the same
                      child until its first failure, then fresh children bisect (step 4,096)
                      while time is left. Ours runs the trainer's defaults (--maxseq-side
                      ours_mid: a batch longer than train.shard_tokens trains in query shards,
                      drafter/train/shards.py): 16K (timed: it compiles the layer at the shard's
                      shape), 131,072 (the goal), 32K (timed), then probes up to --maxseq-probe
                      (256K: on an H200 the time, not the memory, bounds the search); a failure
                      skips only rungs at or past it. The shard size comes from the card's
                      memory (ladder_for: 16K on >= 120 GiB, the trainer's default; 8K below, so
                      an H100 still reaches 128K by bench/memory_model.py), recorded with the
                      figures. SpecForge goes 16K, then probes while time is left.
                      SpecForge's 4K child continues into its ladder (kept compiled; told to go
                      once nothing else holds GPU memory) with MAXSEQ_SF_SHARE of what is left;
                      then ours in a fresh child. Each failure: kind (oom / error), message, the
                      frame in this repository or SpecForge, the free memory then.
  throughput_16k/32k  from our max_seq ladder's timed rungs at 16K and 32K (the defaults):
                      tokens/s, MFU (model FLOPs, bench_train.model_flops) and mfu_executed
                      (what the step executes: the embedding half of the input projections once
                      per unroll, the shards' extra work).
  accept_by_position  long_context_accept.py, GPU-light: runs beside the equal-work children
                      from the start (paused while they time) and must end ACCEPT_GRACE_S after
                      them (max_seq needs the whole GPU); cut otherwise, with its stages done.

The result file is written after every part; a part cut by the budget is recorded as cut (with
what its children finished and the phase they were in), never left out.

SpecForge's compile (specforge 0.2.0 source): torch.compile of flex_attention (static on its
first shape; each TTT step's key length differs, q_len x (k+1), so the second step already
recompiles with dynamic shapes), of create_block_mask (mask closures over Q_LEN/KV_LEN/lck ints:
a variant per TTT step, recompile_limit 64), of LlamaRMSNorm.forward, rotary embedding and
apply_rotary_pos_emb (dynamic=True), of _compute_target_p / the metric functions / the loss
reference (dynamic=None), plus its Triton LogSoftmaxLoss. None of it can be skipped without
changing what is measured, so it gets time instead: started first, beside our children.

FLOP model (bench_train.model_flops, matmuls only): per TTT step and token 2 x (projections +
3 H I + H Vd), attention 2 nh (d_qk + d_v) x visible keys, fc once, teacher 2 H V once;
x3 for forward + backward of the TTT matmuls and attention, x2 fc, x1 teacher. MFU = model
FLOPs / step time / 790 TFLOP/s (H200 bf16 dense); recomputation (checkpointing) is not counted.

SpecForge: its wheel on sys.path, nothing installed (bench_specforge.py). Stage it with
`bench/stage_long_context.sh` (git-ignored .whl/) and carry `.whl`.

A new length costs seconds, not minutes: the flex block mask is built without a compile
(ttt_attention._doc_block_mask; the compiled create_block_mask's Triton sort took 250 s of the
first 16K step on 2026-12-02), only flex attention itself recompiles (static shapes, ~14 s).

The recorded result (2026-12-02, one H200) came from two calls, each carrying .whl:
      A  python3 bench/bench_long_context.py --part equal --part maxseq --budget-s 530  (474 s)
      B  python3 bench/bench_long_context.py --part accept --budget-s 330              (171 s)
  B alone has its whole budget (beside part 1 it is killed ACCEPT_GRACE_S after part 1 ends).

Run:  bash bench/stage_long_context.sh                  (here, with PyPI: the SpecForge wheel)
      python3 bench/bench_long_context.py --budget-s 530 (one H200, one call, carry .whl)
      python3 bench/bench_long_context.py --tiny --budget-s 900   (CPU rehearsal, tiny shapes;
                                                         emulated OOMs past TINY_OOM lengths)
      --part equal|maxseq|accept (repeatable) runs some parts and updates the result file.
Writes bench/results/long-context.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import gpu_gate  # noqa: E402
import long_context_trials as trials  # noqa: E402
from machine_info import describe, portable, save_result  # noqa: E402

K = 1024
# expected peak GiB of each 4K child (measured 2026-12-01/02: ours 47.4, lean 27.8, SpecForge
# 35.1; ours_mid by bench/memory_breakdown.py's arithmetic ~31) and the accept child; children
# start side by side only while the sum of the running ones stays under ADMIT_GB
EXPECTED_GB = {"ours": 44, "ours_mid": 31, "ours_lean": 28, "specforge": 37, "accept": 20}
ADMIT_GB = 124  # of ~139 GiB: room for allocator slack and CUDA contexts; a child of ours
# that still runs out of memory beside others is run again once (alone if need be)
EQUAL_ORDER = ("ours_mid", "specforge", "ours_lean", "ours")  # the defaults first, plain last
EQUAL_SHARE = 0.5  # equal-work children end by this share of the budget
EQUAL_CHILD_S = 210  # one of ours: start, build, compile (~60 s alone, more beside others), 7 steps
ACCEPT_GRACE_S = 15
MAXSEQ_SF_SHARE = 0.4  # of the time left after part 1, SpecForge's ladder (then ours)
FRESH_MIN_S = {
    "ours_lean": 100,
    "specforge": 150,
}  # a fresh bisection child: start + compile + step
MARGIN_S = 12  # writing the result and exiting
PENDING = "pending: the run was stopped before this part ended"
# ours (the trainer's defaults: a batch longer than train.shard_tokens runs in query shards,
# drafter/train/shards.py): 16K first (timed; it compiles the layer at the shard's shape), then the
# goal length, then 32K (timed), then probes while time is left; the shard size from the
# card's memory (ladder_for). SpecForge: 16K, then probes.
OURS_LADDER, SF_LADDER = [16 * K, 128 * K, 32 * K], [16 * K]
# bench/memory_model.py (eager, so above the compiled GPU figures: 36.9 vs 32.24 GiB at 4K
# before the sharded defaults): the defaults at 131,072 tokens peak at ~89 GiB in 16K shards
# (fits an H200's 139.8 GiB), ~68 GiB in 8K shards (an H100's 79.2 GiB)
BIG_CARD_GIB, SHARD_BIG, SHARD_SMALL, PRIOR_TOTAL_GIB = 120, 16 * K, 8 * K, 139.8
MAX_PROBE = 256 * K  # a probe past the ladder: a 256K step is ~80 s on one H200
TINY_SEQ4, TINY_STEP, TINY_T16, TINY_T32 = 256, 128, 512, 1024
TINY_OURS, TINY_SF, TINY_FIRST, TINY_SHARD = [512, 1024], [512, 1024], 1536, 512


def _env(args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # compile workers of children side by side: a share of the cores each, not all of them
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(2, (os.cpu_count() or 8) // 4)))
    if args.tiny:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


class Pool:
    """Child processes, each its own session (process group) listed for gpu_gate; killed (the
    whole group) past their deadline; every group continued whenever one ends."""

    def __init__(self, args) -> None:
        self.args, self.work = args, Path(args.work)
        self.live: dict[str, dict] = {}
        self.ended: dict[str, dict] = {}

    def spawn(
        self, role: str, extra: list[str], deadline: float, gb: float = 0, alone: bool = False
    ) -> None:
        """alone: no other child runs beside it (max_seq): every core compiles for it."""
        a = self.args
        cmd = [
            sys.executable, str(Path(__file__).resolve()), "--worker", role, "--device", a.device,
            "--wheel", str(a.wheel), "--work", str(a.work), "--ttt", str(a.ttt),
            "--epochs", str(a.epochs), "--target-steps", str(a.target_steps), "--spawned-at", str(time.time()), *extra,
        ]  # fmt: skip
        if a.tiny:
            cmd.append("--tiny")
        log = open(self.work / f"{role}.log", "w")  # noqa: SIM115 (closed when it ends)
        env = _env(a)
        if alone and "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(2, os.cpu_count() or 8))
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.live[role] = {
            "proc": proc,
            "deadline": deadline,
            "gb": gb,
            "t0": time.time(),
            "log": log,
        }
        gpu_gate.register(self.work, [p["proc"].pid for p in self.live.values()])

    def reap(self) -> list[str]:
        """Roles that ended (exited, or killed past their deadline) since the last call."""
        out = []
        for role, p in list(self.live.items()):
            rc = p["proc"].poll()
            killed = None
            if rc is None and time.time() > p["deadline"]:
                killed = f"killed by the time budget after {time.time() - p['t0']:.0f} s"
                try:
                    os.killpg(p["proc"].pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rc = p["proc"].wait()
            if rc is None:
                continue
            p["log"].close()
            self.ended[role] = {
                "rc": rc,
                "killed": killed,
                "seconds": round(time.time() - p["t0"], 1),
            }
            del self.live[role]
            out.append(role)
        if out:
            gpu_gate.register(self.work, [p["proc"].pid for p in self.live.values()])
            gpu_gate.signal_groups([p["proc"].pid for p in self.live.values()], signal.SIGCONT)
        return out

    def result(self, role: str) -> dict:
        """The child's record (possibly partial), with how it ended."""
        path = self.work / f"{role}.json"
        res: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        end = self.ended.get(role, {})
        if end.get("killed"):
            res["cut"] = f"{end['killed']} (phase: {res.get('phase', 'start')})"
        elif end.get("rc"):
            tail = (self.work / f"{role}.log").read_text()[-2500:]
            res["error"] = res.get("error") or f"exit {end['rc']}: {tail}"
        res["worker_s"] = end.get("seconds")
        return res

    def gb(self) -> float:
        return sum(p["gb"] for p in self.live.values())

    def wait(self, roles: set[str], until: float) -> None:
        while roles & set(self.live) and time.time() < until + 1:
            self.reap()
            time.sleep(0.2)
        self.reap()

    def kill(self, role: str) -> None:
        if role in self.live:
            self.live[role]["deadline"] = 0
            self.reap()


# -- the parts -------------------------------------------------------------------------------


class Run:
    def __init__(self, args, report: dict) -> None:
        self.args, self.report = args, report
        self.t0 = time.time()
        self.end = self.t0 + args.budget_s - MARGIN_S
        self.pool = Pool(args)
        self.tiny = args.tiny
        self.sf_ok = Path(args.wheel).exists()
        self.plan: dict[str, Any] = {"budget_s": args.budget_s, "margin_s": MARGIN_S}
        self.not_started: list[str] = []
        self.retried: list[str] = []
        report["budget"] = self.plan

    def at(self) -> float:
        return round(time.time() - self.t0, 1)

    def save(self) -> None:
        self.report["elapsed_s"] = self.at()
        save_result(self.args.out, self.report)

    def seq4(self) -> int:
        return TINY_SEQ4 if self.tiny else 4 * K

    # part 1 (+ accept beside it)

    def equal_and_accept(self, parts: list[str]) -> None:
        a, pool = self.args, self.pool
        eq_end = self.t0 + a.equal_share * a.budget_s
        self.plan["equal_work_4k"] = {
            "ends_by_s": round(eq_end - self.t0),
            "child_cap_s": EQUAL_CHILD_S,
        }
        if "accept" in parts:  # beside part 1 it must end soon after it; otherwise: all of it
            alone = "equal" not in parts or "maxseq" not in parts
            pool.spawn(
                "accept", [], self.end if alone else eq_end + ACCEPT_GRACE_S, EXPECTED_GB["accept"]
            )
        queue = (
            [s for s in EQUAL_ORDER if s != "specforge" or self.sf_ok] if "equal" in parts else []
        )
        sf_role = None
        while queue or (set(pool.live) - {"accept", "sf"}) or (sf_role and not self.sf_waiting()):
            for side in list(queue):
                if not self.admit(side, eq_end):
                    continue
                queue.remove(side)
                base = ["--side", side, "--seqs", str(self.seq4()), "--timed", "5", "--warmup", "2"]
                if side == "specforge":
                    sf_role = "sf"
                    extra = base + ["--go-file", str(Path(a.work) / "go-sf")]
                    if "maxseq" in parts:
                        sf_l = TINY_SF if self.tiny else SF_LADDER
                        extra += ["--then-seqs", ",".join(map(str, sf_l)), "--then-timed", "0"]
                        extra += ["--search", "--step", str(self.step())]
                    # alive past part 1 (kept compiled for max_seq); its 4K must be done by eq_end
                    pool.spawn(
                        "sf",
                        extra + ["--worker-budget-s", str(a.budget_s)],
                        self.end,
                        EXPECTED_GB[side],
                    )
                else:
                    cap = min(time.time() + EQUAL_CHILD_S, eq_end)
                    pool.spawn(
                        f"eq-{side}",
                        base + ["--worker-budget-s", str(cap - time.time())],
                        cap,
                        EXPECTED_GB[side],
                    )
            for role in pool.reap():
                side = role.removeprefix("eq-")
                if role.startswith("eq-") and side not in self.retried and self.oom(role):
                    self.retried.append(side)  # out of memory beside others: once more
                    queue.insert(0, side)
            if time.time() > eq_end:
                self.not_started = list(queue)
                queue = []
                if sf_role and not self.sf_waiting():
                    pool.kill("sf")
                    sf_role = None
                for role in set(pool.live) - {"accept", "sf"}:
                    pool.kill(role)
            time.sleep(0.2)
        self.plan["equal_work_4k"]["ended_at_s"] = self.at()
        if "maxseq" not in parts:
            (Path(a.work) / "go-sf").write_text("stop")
        if "equal" in parts:
            self.report["equal_work_4k"] = self.summarise_equal()
            self.save()
        if "accept" in parts:  # max_seq needs the whole GPU: a short grace, unless it is not run
            grace = min(time.time() + ACCEPT_GRACE_S, eq_end + ACCEPT_GRACE_S)
            pool.wait({"accept"}, grace if "maxseq" in parts else self.end)
            pool.kill("accept")
            self.report["accept_by_position"] = self.summarise_accept()
            self.plan["accept_by_position"] = {"beside_part_1": True, "ended_at_s": self.at()}
            self.save()

    def admit(self, side: str, eq_end: float) -> bool:
        if time.time() > eq_end - (5 if self.tiny else 30):  # too late to be worth starting
            return False
        running = [
            r for r in self.pool.live if r != "accept" and not (r == "sf" and self.sf_waiting())
        ]
        if side in self.retried and any(r.startswith("eq-") for r in self.pool.live):
            return False  # the rerun after an OOM beside others: no other child of ours
        if self.args.device == "cpu":
            return len(running) < 2
        return self.pool.gb() + EXPECTED_GB[side] <= self.admit_gb()

    def admit_gb(self) -> float:
        """ADMIT_GB on an H200, the same share of a smaller card (an H100: ~70 of 79 GiB)."""
        if "admit_gb" not in self.plan:
            total = self.gpu_total_gib()
            self.plan["admit_gb"] = round(ADMIT_GB * min(1.0, total / PRIOR_TOTAL_GIB), 1)
        return self.plan["admit_gb"]

    def oom(self, role: str) -> bool:
        trials_ = self.pool.result(role).get("trials", [])
        return any(t.get("kind") == "oom" for t in trials_)

    def sf_waiting(self) -> bool:
        """SpecForge's child finished its 4K trial (waiting for max_seq, or ended)."""
        if "sf" not in self.pool.live:
            return True
        path = Path(self.args.work) / "sf.json"
        try:
            rec = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return False
        return rec.get("phase") in ("waiting for go", "done") or any(
            t.get("ok") is False for t in rec.get("trials", [])
        )

    def summarise_equal(self) -> dict:
        out: dict[str, Any] = {}
        if not self.sf_ok:
            out["specforge"] = {"error": self.report["specforge_wheel"]}
        for side in self.not_started:
            out[side] = {"cut": f"not started by {self.args.equal_share:.0%} of the budget"}
        for side in EQUAL_ORDER:
            role = "sf" if side == "specforge" else f"eq-{side}"
            if role in self.pool.ended or role in self.pool.live:
                out[side] = summary_4k(self.pool.result(role), self.seq4())
        sf = out.get("specforge", {})
        for side in ("ours", "ours_mid", "ours_lean"):
            o = out.get(side, {})
            if o.get("tokens_per_s") and sf.get("tokens_per_s"):
                tr = round(o["tokens_per_s"] / sf["tokens_per_s"], 3)
                mr = (
                    round(o["peak_mem_gb"] / sf["peak_mem_gb"], 3)
                    if o.get("peak_mem_gb") and sf.get("peak_mem_gb")
                    else None
                )
                out[f"{side}_vs_specforge"] = {
                    "throughput_ratio": tr,
                    "memory_ratio": mr,
                    "meets_goal": bool(tr >= 1.2 and mr is not None and mr <= 0.8),  # issue 27
                }
        out["seq"] = self.seq4()
        out["rerun_after_oom_beside_others"] = self.retried
        out["options"] = {s: trials.OPTION_SETS[s] for s in ("ours", "ours_mid", "ours_lean")}
        return out

    def summarise_accept(self) -> dict:
        res = self.pool.result("accept")
        for key in ("with_long", "without_long"):
            res.setdefault(key, {"cut": res.get("cut") or res.get("error", "not reached")})
        return res

    # part 2

    def step(self) -> int:
        return TINY_STEP if self.tiny else 4096

    def max_seq(self) -> None:
        a, pool = self.args, self.pool
        detail: dict[str, Any] = {}
        self.plan["max_seq"] = {"started_at_s": self.at()}
        # SpecForge: its 4K child continues (nothing else holds GPU memory now)
        sf_trials: list[dict] = []
        if "sf" in pool.live and a.sf_maxseq_share <= 0:  # its ladder left out (budget)
            (Path(a.work) / "go-sf").write_text("stop")
            pool.wait({"sf"}, time.time() + 20)
            pool.kill("sf")
            detail["specforge"] = {"cut": "its max_seq ladder was left out (--sf-maxseq-share 0)"}
        elif "sf" in pool.live:
            share = max(60.0, a.sf_maxseq_share * (self.end - time.time()))
            self.plan["max_seq"]["specforge_share_s"] = round(share)
            pool.live["sf"]["deadline"] = time.time() + share
            (Path(a.work) / "go-sf").write_text(str(max(share - 20, 10)))
            pool.wait({"sf"}, time.time() + share)
            res = pool.result("sf")
            sf_trials = list(res.get("trials", []))  # the 4K trial is its first rung
            detail["specforge"] = {"ladder_child": strip(res), "cut": res.get("cut")}
        elif self.sf_ok:
            detail["specforge"] = {"cut": "its 4K child did not reach max_seq"}
        # ours: a fresh child with the trainer's defaults (long batches in query shards); the
        # ladder and the shard size from the card's memory (ladder_for)
        total = self.gpu_total_gib()
        ladder, shard = ladder_for(total, self.tiny)
        if a.first_seq:
            ladder = [a.first_seq] + [x for x in (a.ours_ladder or ladder[1:]) if x != a.first_seq]
        elif a.ours_ladder:
            ladder = [ladder[0]] + [x for x in a.ours_ladder if x != ladder[0]]
        shard = a.maxseq_shard or shard
        self.plan["max_seq"].update(
            ours_side=a.maxseq_side, ours_ladder=ladder, shard_tokens=shard, gpu_total_gib=total
        )
        allowed = self.end - time.time()
        self.plan["max_seq"]["ours_share_s"] = round(allowed)
        extra = [
            "--side", a.maxseq_side, "--seqs", ",".join(map(str, ladder)), "--timed", "2",
            "--warmup", "1", "--search", "--step", str(self.step()),
            "--max-probe", str(MAX_PROBE if a.maxseq_probe is None and not self.tiny
                                else a.maxseq_probe or 0),
            "--timed-max-seq", str(TINY_T32 if self.tiny else 32 * K),
            "--shard-tokens", str(shard),
            "--worker-budget-s", str(max(allowed - 25, 10)),
        ]  # fmt: skip
        ours_trials: list[dict] = []
        if allowed > 60:
            pool.spawn("max-ours", extra, self.end, 0, alone=True)
            pool.wait({"max-ours"}, self.end)
            res = pool.result("max-ours")
            ours_trials = list(res.get("trials", []))
            detail["ours"] = {"ladder_child": strip(res), "cut": res.get("cut")}
        else:
            detail["ours"] = {"cut": f"{allowed:.0f} s left after SpecForge's ladder"}
        self.throughputs(ours_trials)
        # fresh-child bisection while time is left: ours first (the goal), then SpecForge
        for side, tr in ((a.maxseq_side, ours_trials), ("specforge", sf_trials)):
            if tr:
                tr.extend(self.bisect(side, tr, shard if side != "specforge" else 0))
        for name, tr in (("ours", ours_trials), ("specforge", sf_trials)):
            detail.setdefault(name, {}).update(bracket(tr, self.step()))
        self.report["max_seq_detail"] = detail
        ms: dict[str, Any] = {
            name: detail[name].get("max_ok") for name in ("ours", "specforge") if name in detail
        }
        ms.setdefault("specforge", None)
        for name in ("ours", "specforge"):  # why a length is missing
            d = detail.get(name, {})
            if ms.get(name) is None:
                ms[f"{name}_note"] = (
                    d.get("cut") or (d.get("failure") or {}).get("error") or "no success"
                )
        if ms.get("ours") and ms.get("specforge"):
            ms["ratio"] = round(ms["ours"] / ms["specforge"], 2)
        ms["goal"] = ">= 131072 tokens on one H200 (issue 27)"
        self.report["max_seq"] = ms
        self.plan["max_seq"]["ended_at_s"] = self.at()
        self.save()

    def gpu_total_gib(self) -> float:
        """The card's memory as the children recorded it (torch), else nvidia-smi's, else the
        H200's; the orchestrator itself never opens a CUDA context."""
        for role in list(self.pool.ended) + list(self.pool.live):
            got = self.pool.result(role).get("gpu_total_gib")
            if got:
                return float(got)
        if self.tiny or self.args.device == "cpu":
            return 0.0
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=20,
            )  # fmt: skip
            return round(float(out.stdout.split()[0]) / 1024, 2)
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return PRIOR_TOTAL_GIB

    def bisect(self, side: str, tr: list[dict], shard: int = 0) -> list[dict]:
        out: list[dict] = []
        for i in range(self.args.bisect):
            b = bracket(tr + out, self.step())
            lo, hi = b["max_ok"] or 0, b["first_fail"]
            left = self.end - time.time()
            if (
                hi is None
                or hi - lo <= self.step()
                or left < (20 if self.tiny else FRESH_MIN_S[side])
            ):
                break
            mid = (lo + hi) // 2 // self.step() * self.step()
            role = f"bisect-{side}-{i}"
            extra = ["--shard-tokens", str(shard)] if shard else []
            self.pool.spawn(role, ["--side", side, "--seqs", str(mid), "--timed", "0", "--warmup", "1",
                                   "--worker-budget-s", str(left - 10), *extra], self.end, 0)  # fmt: skip
            self.pool.wait({role}, self.end)
            res = self.pool.result(role)
            t = next((t for t in res.get("trials", []) if t.get("seq") == mid and "ok" in t), None)
            if t is None:  # cut before the trial ended: says nothing about the length
                self.report.setdefault("max_seq_cut_trials", []).append(
                    {"side": side, "seq": mid, **strip(res)}
                )
                break
            out.append({**t, "fresh_process": True})
        return out

    def throughputs(self, ours_trials: list[dict]) -> None:
        by_seq = {t["seq"]: t for t in ours_trials}
        keys = (
            "seq",
            "tokens_per_s",
            "mfu",
            "model_tflops_per_s",
            "peak_mem_gb",
            "step_s",
            "step_s_all",
        )
        for label, seq in (("throughput_16k", 16 * K), ("throughput_32k", 32 * K)):
            if self.tiny:
                seq = TINY_T16 if seq == 16 * K else TINY_T32
            t = by_seq.get(seq, {})
            if t.get("ok") and t.get("tokens_per_s"):
                side = self.args.maxseq_side
                self.report[label] = {k: t.get(k) for k in keys} | {
                    "options": {"side": side, **trials.OPTION_SETS[side]}
                    | {"shard_tokens": self.plan["max_seq"].get("shard_tokens")},
                    "mfu_executed": t.get("mfu_executed"),
                }
            else:
                why = t.get("error") or t.get("skipped") or "not reached in the budget"
                self.report[label] = {"seq": seq, "cut" if "error" not in t else "error": why}


def ladder_for(total_gib: float, tiny: bool = False) -> tuple[list[int], int]:
    """Our max_seq rungs and the shard size for a card of `total_gib`: 16K (timed), the goal
    length 131,072, 32K (timed); shards of 16K where the card has >= BIG_CARD_GIB (an H200;
    the trainer's default), else 8K (an H100: the defaults' 16K shards would not leave room
    for 128K, bench/memory_model.py). The tiny CPU rehearsal: its own lengths, shards of 512."""
    if tiny:
        return [TINY_FIRST, *TINY_OURS], TINY_SHARD
    return list(OURS_LADDER), SHARD_BIG if total_gib >= BIG_CARD_GIB else SHARD_SMALL


def strip(res: dict) -> dict:
    return {k: v for k, v in res.items() if k not in ("trials",)}


def bracket(tr: list[dict], step: int) -> dict:
    ok = [t["seq"] for t in tr if t.get("ok")]
    bad = [t for t in tr if t.get("ok") is False]
    hi_t = min(bad, key=lambda t: t["seq"]) if bad else None
    lo = max(ok) if ok else None
    return {
        "max_ok": lo,
        "first_fail": hi_t["seq"] if hi_t else None,
        "failure": {
            k: hi_t.get(k)
            for k in (
                "seq",
                "kind",
                "error",
                "where",
                "free_gib_at_failure",
                "allocated_gib_at_failure",
            )
        }
        if hi_t
        else None,
        "resolution": (hi_t["seq"] - (lo or 0)) if hi_t else None,
        "bounded_by": None if hi_t else "no failure seen (ladder top, probes or time budget)",
        "trials": sorted(tr, key=lambda t: t["seq"]),
    }


def summary_4k(res: dict, seq: int) -> dict:
    t = next((t for t in res.get("trials", []) if t.get("seq") == seq), {})
    phases = res.get("phases", {})
    if t.get("ok") and t.get("tokens_per_s"):
        keep = (
            "tokens_per_s",
            "peak_mem_gb",
            "peak_mem_gb_warmup",
            "step_s",
            "step_s_all",
            "warmup0_s",
            "gate_wait_s",
        )
        return {k: t.get(k) for k in keep} | {"phases": phases, "worker_s": res.get("worker_s")}
    if t.get("ok") is False:
        return {k: t.get(k) for k in ("kind", "error", "where", "free_gib_at_failure")} | {
            "phases": phases
        }
    return {
        "cut": res.get("cut") or res.get("error") or "no result",
        "phase": res.get("phase"),
        "phases": phases,
    }


# -- entry -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="tiny shapes and lengths (CPU rehearsal)")
    p.add_argument("--budget-s", type=float, default=530, help="wall-clock budget of the run")
    p.add_argument("--part", action="append", choices=("equal", "maxseq", "accept"))
    p.add_argument("--wheel", type=Path, default=REPO / ".whl" / "specforge-0.2.0-py3-none-any.whl")
    p.add_argument("--ttt", type=int, default=7)
    p.add_argument("--epochs", type=int, default=2, help="acceptance part: drafter epochs")
    p.add_argument("--target-steps", type=int, default=120, help="acceptance part: tiny target")
    p.add_argument("--bisect", type=int, default=3, help="fresh bisection children per side")
    p.add_argument(
        "--equal-share", type=float, default=EQUAL_SHARE, help="equal-work part ends by this share"
    )
    p.add_argument(
        "--sf-maxseq-share", type=float, default=MAXSEQ_SF_SHARE,
        help="SpecForge's max_seq ladder: this share of the time after part 1 (0 = left out)",
    )  # fmt: skip
    p.add_argument("--first-seq", type=int, help="ours' first max_seq rung (default: 16K)")
    p.add_argument(
        "--ours-ladder", type=trials._ints, help="ours' max_seq rungs after the first (128K,32K)"
    )
    p.add_argument(
        "--maxseq-side", default="ours_mid", choices=("ours_mid", "ours_lean"),
        help="our option set for max_seq and 16K/32K (default: the trainer's defaults)",
    )  # fmt: skip
    p.add_argument(
        "--maxseq-shard", type=int, help="train.shard_tokens there (default: from the card)"
    )
    p.add_argument(
        "--maxseq-probe", type=int, help="longest probe past the ladder (default 256K; 0: none)"
    )
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "long-context.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--spawned-at", type=float, help=argparse.SUPPRESS)
    trials.add_arguments(p)
    args = p.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.ttt = min(args.ttt, 3)
    if args.worker:
        return worker(args)
    parts = args.part or ["equal", "maxseq", "accept"]
    args.work = args.work or Path(tempfile.mkdtemp(prefix="bench-long-context-"))
    args.work.mkdir(parents=True, exist_ok=True)
    import transformers

    sf_ok = Path(args.wheel).exists()
    report: dict = {
        "bench": "long-context",
        "machine": describe(device=args.device, transformers=transformers.__version__),
        "shape": "tiny (CPU rehearsal)"
        if args.tiny
        else "Kimi-K2.5 drafter: hidden 7168, 64x112 heads, MLP 18432, vocab 163840 -> 32000, TTT 7",
        "specforge_wheel": str(args.wheel)
        if sf_ok
        else f"missing: {args.wheel} (run bench/stage_long_context.sh)",
        "flop_model": "bench_train.model_flops (matmuls; x3 train for TTT steps + attention, x2 fc, x1 teacher); MFU vs 790 TFLOP/s",
        "work": str(args.work),
    }
    if args.part and args.out.exists():  # a run of some parts updates the others' result
        report = {**json.loads(args.out.read_text()), **report}
    of_part = {"equal_work_4k": "equal", "max_seq": "maxseq", "throughput_16k": "maxseq",
               "throughput_32k": "maxseq", "accept_by_position": "accept"}  # fmt: skip
    for key, part in of_part.items():
        if part in parts:
            report[key] = {"cut": PENDING}
        elif key not in report:
            report[key] = {"cut": "not run (part not selected)"}
    run = Run(args, report)
    run.save()  # the file exists from the start; each part replaces its keys when it ends
    try:
        if "equal" in parts or "accept" in parts:
            run.equal_and_accept(parts)
        if "maxseq" in parts:
            run.max_seq()
    finally:
        for role in list(run.pool.live):
            run.pool.kill(role)
        for key in of_part:
            if report.get(key) == {"cut": PENDING}:
                report[key] = {"cut": "not reached in the budget"}
        run.save()
    shown = {k: v for k, v in report.items() if k != "max_seq_detail"}
    print(json.dumps(portable(shown), indent=1, default=str)[:6000])
    print_summary(report)
    return 0


def worker(args) -> int:
    import torch

    if args.device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
    if args.worker == "accept":
        import long_context_accept

        long_context_accept.run(args)
        return 0
    trials.Worker(args).run()
    return 0


def print_summary(r: dict) -> None:
    e = r.get("equal_work_4k", {})
    sf = e.get("specforge", {})
    for side in ("ours", "ours_mid", "ours_lean"):
        o = e.get(side, {})
        ratio = e.get(f"{side}_vs_specforge", {})
        print(
            f"long-context [4K equal work] {side}: {o.get('tokens_per_s')} tok/s, "
            f"{o.get('peak_mem_gb')} GB vs SpecForge {sf.get('tokens_per_s')} tok/s, "
            f"{sf.get('peak_mem_gb')} GB: throughput {ratio.get('throughput_ratio')}x, "
            f"memory {ratio.get('memory_ratio')}x" + (f" ({o['cut']})" if "cut" in o else "")
        )
    m = r.get("max_seq", {})
    print(
        f"long-context [max seq] ours {m.get('ours')} vs SpecForge {m.get('specforge')} tokens "
        f"(ratio {m.get('ratio')}; goal >= 131072)"
    )
    for label in ("throughput_16k", "throughput_32k"):
        t = r.get(label, {})
        print(
            f"long-context [{label}] {t.get('tokens_per_s')} tok/s, MFU {t.get('mfu')}"
            + (f" ({t['cut']})" if "cut" in t else "")
        )
    acc = r.get("accept_by_position", {})
    for name in ("without_long", "with_long"):
        cells = acc.get(name)
        if isinstance(cells, list):
            print(
                f"long-context [accept by position] {name}: "
                + ", ".join(f"{x['bucket']}: {x['accept_length']}" for x in cells)
            )
        else:
            print(f"long-context [accept by position] {name}: {cells}")


if __name__ == "__main__":
    sys.exit(main())
