"""`eagle3 plan`: what a production run costs before the box is rented (issue 26).

From the merged dataset's token count and the box's numbers (measured, or stated assumptions),
per dump format: dump size, extraction time, training time, and the sustained read bandwidth the
trainer needs (training reads the whole dump once per epoch at its token rate). A short probe
measures this volume's sustained read bandwidth (`--probe DIR`: write and fsync a file, then read
it back with O_DIRECT, bypassing the page cache, or where the file system refuses O_DIRECT, after
posix_fadvise(DONTNEED) with mincore saying how much stayed cached; the method is in the output,
with the rate over time so a cache running out shows). `--from PLAN.json` re-plans a recorded
plan's inputs (with a probe on the box at hand, say). When the
trainer would need more than the disk gives, training is disk-bound: the plan says so and names
the remedies (fp8 aux, fewer epochs, a faster volume, or the online mode that never writes dumps).

Bytes per token come from the dump format itself (dense.DumpMeta.bytes_per_token): Kimi-K2.5
(hidden 7168, 3 aux layers) is 57,348 B/token with bf16 aux and 35,856 with fp8 aux (per-token
fp32 scales; the final state stays bf16; + the int32 id).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput

HELP = "dump size, extraction/training time and disk bandwidth a run needs (before renting)"
GB = 1e9


def bytes_per_token(hidden: int, aux_layers: int, aux_dtype: str) -> int:
    from remote_agent.eagle3.dense import DumpMeta

    meta = DumpMeta(
        model="plan",
        hidden_size=hidden,
        num_layers=aux_layers + 3,
        aux_layer_ids=list(range(1, aux_layers + 1)),
        aux_dtype=aux_dtype,
        producer="plan",
    )
    return meta.bytes_per_token()


PROBE_BLOCK = 8 << 20  # bytes per read/write: a multiple of every disk's logical block size


def _cached_fraction(path: Path) -> float | None:
    """Fraction of `path`'s pages in the page cache (mincore on a private mapping), or None."""
    import ctypes
    import ctypes.util
    import mmap

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        page = mmap.PAGESIZE
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return 0.0
            # ACCESS_COPY: a writable private mapping, so ctypes can take its address; nothing is
            # written, so every page still reports the file's page-cache residency
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
            try:
                buf = (ctypes.c_char * size).from_buffer(mm)
                pages = (size + page - 1) // page
                vec = (ctypes.c_ubyte * pages)()
                rc = libc.mincore(
                    ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec
                )
                del buf
                if rc != 0:
                    return None
                return sum(v & 1 for v in vec) / pages
            finally:
                mm.close()
    except (OSError, AttributeError, ValueError, TypeError):
        return None


def _open_direct(path: Path) -> int | None:
    """An O_DIRECT descriptor (reads bypass the page cache), or None where the OS or the file
    system has none (macOS, some FUSE and network file systems)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_RDONLY | flag)
    except OSError:
        return None


def _read_range(path: Path, start: int, stop: int, direct: bool, done_at: list, lock) -> int:
    """Read [start, stop) in PROBE_BLOCK blocks into one page-aligned buffer (O_DIRECT needs
    it); each block's (finish time, bytes) goes to `done_at` for the rate over time."""
    import mmap

    fd = _open_direct(path) if direct else None
    if fd is None:
        fd = os.open(path, os.O_RDONLY)
    buf = mmap.mmap(-1, PROBE_BLOCK)
    done = 0
    try:
        off = start
        while off < stop:
            n = os.preadv(fd, [buf], off)
            if n <= 0:
                break
            with lock:
                done_at.append((time.perf_counter(), n))
            off += n
            done += n
    finally:
        buf.close()
        os.close(fd)
    return done


def probe_read_gbps(
    directory: Path, mb: int = 512, readers: int = 1, direct: bool | None = None
) -> dict[str, Any]:
    """Sustained sequential read bandwidth of `directory`'s volume, not the page cache's.

    Writes a fresh file of `mb` MiB (random bytes, fsynced: the write rate), then reads it back
    with `readers` threads, each a contiguous share (the trainer's ranks read at once), in
    8 MiB blocks. Method, in order of preference:
    - `o_direct`: the reads bypass the page cache (O_DIRECT, page-aligned buffers), so the file
      size does not matter (a virtual disk's host may still cache it: an upper bound there);
    - `posix_fadvise_dontneed`: where O_DIRECT is refused, the file's pages are dropped with
      posix_fadvise(DONTNEED) after the fsync; mincore then says how much of the file is still
      cached (`cached_fraction_before_read`), and the result is flagged when any is.
    `direct=False` forces the second method (tests)."""
    import threading

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".eagle3-plan-probe-{os.getpid()}"
    block = os.urandom(PROBE_BLOCK)
    n = max(1, (mb << 20) // PROBE_BLOCK)
    size = n * PROBE_BLOCK
    readers = max(1, min(readers, n))
    result: dict[str, Any] = {"dir": str(directory), "bytes": size, "readers": readers}
    try:
        t0 = time.perf_counter()
        with open(path, "wb", buffering=0) as f:
            for _ in range(n):
                f.write(block)
            os.fsync(f.fileno())
        write_s = time.perf_counter() - t0
        fd = _open_direct(path) if direct is not False else None
        method = "o_direct" if fd is not None else "posix_fadvise_dontneed"
        if fd is not None:
            os.close(fd)
        if hasattr(os, "posix_fadvise"):  # also before O_DIRECT reads: a file system that
            fd = os.open(path, os.O_RDONLY)  # quietly serves them from the cache then cannot
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        elif method != "o_direct":
            method = "plain_read"  # no way to drop the cache here: likely the cache's rate
        cached = _cached_fraction(path)
        per = -(-n // readers) * PROBE_BLOCK
        done_at: list = []
        lock = threading.Lock()
        got = [0] * readers

        def work(i: int) -> None:
            got[i] = _read_range(
                path, i * per, min(size, (i + 1) * per), method == "o_direct", done_at, lock
            )

        threads = [threading.Thread(target=work, args=(i,)) for i in range(readers)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        read_s = time.perf_counter() - t0
        if sum(got) != size:
            raise BadInput(f"--probe {directory}: read {sum(got)} of {size} bytes back")
    finally:
        path.unlink(missing_ok=True)
    # sustained: the rate (all readers together) in each eighth of the read's duration, so a
    # cache that runs out partway (a fast start, then the disk) shows as a falling tail
    rates = _rate_by_slice(done_at, t0, read_s, min(8, n))
    result.update(
        method=method,
        read_gb_per_s=round(size / read_s / GB, 3),
        write_gb_per_s=round(size / write_s / GB, 3),
        read_seconds=round(read_s, 2),
        write_seconds=round(write_s, 2),
        read_gb_per_s_by_eighth_of_time=rates,
        cached_fraction_before_read=None if cached is None else round(cached, 4),
        note=_probe_note(method, cached),
    )
    return result


def _rate_by_slice(done_at: list, start: float, seconds: float, slices: int) -> list[float]:
    """GB/s of the blocks finished in each of `slices` equal slices of the read's duration."""
    if seconds <= 0 or not done_at:
        return []
    width = seconds / slices
    got = [0] * slices
    for t, b in done_at:
        got[min(slices - 1, int((t - start) / width))] += b
    return [round(b / width / GB, 3) for b in got]


def _probe_note(method: str, cached: float | None) -> str:
    if method == "o_direct":
        return (
            "O_DIRECT reads: the page cache is bypassed whatever the file size; on a virtual "
            "disk the host may cache it, so there the figure is an upper bound"
        )
    if method == "posix_fadvise_dontneed":
        if cached is None:
            return (
                "O_DIRECT refused: page cache dropped with posix_fadvise(DONTNEED), residency "
                "not measurable here (no mincore); a file system that ignores it reads faster"
            )
        if cached > 0.01:
            return (
                f"O_DIRECT refused and {cached:.0%} of the file stayed cached after "
                "posix_fadvise(DONTNEED): the figure is the cache's, an upper bound"
            )
        return (
            "O_DIRECT refused: page cache dropped with posix_fadvise(DONTNEED); mincore found "
            f"{cached:.1%} of the file cached before the read"
        )
    return "no O_DIRECT and no posix_fadvise: the read may come from the page cache"


def make_plan(
    tokens: int,
    hidden: int,
    aux_layers: int,
    epochs: float,
    train_tokens_per_s: float,
    extract_tokens_per_s: float,
    read_gb_per_s: float | None,
    assumptions: dict[str, str] | None = None,
) -> dict[str, Any]:
    formats = {}
    for aux in ("bf16", "fp8_e4m3"):
        bpt = bytes_per_token(hidden, aux_layers, aux)
        need = train_tokens_per_s * bpt / GB
        disk_bound = read_gb_per_s is not None and need > read_gb_per_s
        # when disk-bound the trainer runs at the disk's pace, not its own
        rate = min(train_tokens_per_s, read_gb_per_s * GB / bpt) if read_gb_per_s else None
        formats[aux] = {
            "bytes_per_token": bpt,
            "dump_bytes": tokens * bpt,
            "dump_tb": round(tokens * bpt / 1e12, 3),
            "extract_write_gb_per_s": round(extract_tokens_per_s * bpt / GB, 3),
            "train_read_gb_per_s_needed": round(need, 3),
            "disk_bound": disk_bound,
            "train_hours_at_disk_pace": (
                round(tokens * epochs / rate / 3600, 2) if rate and disk_bound else None
            ),
        }
    plan = {
        "tokens": tokens,
        "hidden_size": hidden,
        "aux_layers": aux_layers,
        "epochs": epochs,
        "extract_tokens_per_s": extract_tokens_per_s,
        "train_tokens_per_s": train_tokens_per_s,
        "disk_read_gb_per_s": read_gb_per_s,
        "extraction_hours": round(tokens / extract_tokens_per_s / 3600, 2),
        "training_hours": round(tokens * epochs / train_tokens_per_s / 3600, 2),
        "formats": formats,
        "assumptions": assumptions or {},
    }
    plan["verdict"], plan["remedies"] = verdict(plan)
    return plan


def verdict(plan: dict[str, Any]) -> tuple[str, list[str]]:
    f = plan["formats"]
    if plan["disk_read_gb_per_s"] is None:
        return "unknown: no disk read bandwidth (run with --probe DIR or --read-gbps)", []
    if not f["bf16"]["disk_bound"]:
        return "ok: training is not disk-bound with bf16 aux", []
    remedies = []
    if not f["fp8_e4m3"]["disk_bound"]:
        remedies.append(
            f"fp8 aux (`extract --aux-dtype fp8_e4m3`): {f['fp8_e4m3']['bytes_per_token']:,} "
            f"B/token needs {f['fp8_e4m3']['train_read_gb_per_s_needed']} GB/s"
        )
    else:
        remedies.append(
            f"fp8 aux alone is not enough: {f['fp8_e4m3']['train_read_gb_per_s_needed']} GB/s "
            f"needed vs {plan['disk_read_gb_per_s']} GB/s"
        )
    remedies += [
        "fewer epochs do not lower the bandwidth, only the hours spent at the disk's pace "
        f"({f['bf16']['train_hours_at_disk_pace']} h bf16 for {plan['epochs']} epochs)",
        f"a faster volume: >= {f['bf16']['train_read_gb_per_s_needed']} GB/s sustained reads "
        "(local NVMe RAID, several volumes striped)",
        "the online mode: the trainer takes hidden states from a live SGLang, no dump is written "
        "or read",
    ]
    return "disk-bound: training would wait on the disk with bf16 aux", remedies


def render(plan: dict[str, Any]) -> str:
    lines = [
        f"plan: {plan['tokens']:,} tokens, hidden {plan['hidden_size']}, {plan['aux_layers']} aux "
        f"layers, {plan['epochs']} epochs",
        f"  extraction: {plan['extraction_hours']} h at {plan['extract_tokens_per_s']:,.0f} tokens/s",
        f"  training:   {plan['training_hours']} h at {plan['train_tokens_per_s']:,.0f} tokens/s",
        f"  disk read:  {plan['disk_read_gb_per_s']} GB/s" + _probe_line(plan.get("probe")),
    ]
    for name, f in plan["formats"].items():
        lines.append(
            f"  {name:9s} {f['bytes_per_token']:>7,} B/token  dump {f['dump_tb']} TB  training "
            f"reads {f['train_read_gb_per_s_needed']} GB/s"
            + ("  DISK-BOUND" if f["disk_bound"] else "")
        )
    lines.append(f"verdict: {plan['verdict']}")
    lines += [f"  remedy: {r}" for r in plan["remedies"]]
    return "\n".join(lines)


DEFAULTS = {"hidden": 7168, "aux_layers": 3, "epochs": 3.0}
# the dump format production runs use (runbooks/kimi-k25-eagle3*.yaml `aux_dtype`): the A/B on the
# tiny target (bench/bench_fp8_aux.py) found acceptance unchanged within its CI95 with fp8 aux
RECOMMENDED_AUX = "fp8_e4m3"
RECOMMENDED_WHY = (
    "fp8 aux (the final state stays bf16): acceptance unchanged within CI95 in the A/B on the "
    "tiny target (bench/results/fp8-aux-ab.json: 1.830 vs 1.831 bf16), 35,856 instead of 57,348 "
    "B/token at Kimi-K2.5's size"
)
# the plan's inputs, as --from reads them back from a recorded plan: JSON key -> argument
FROM_KEYS = {
    "tokens": "tokens",
    "hidden_size": "hidden",
    "aux_layers": "aux_layers",
    "epochs": "epochs",
    "train_tokens_per_s": "train_tokens_per_s",
    "extract_tokens_per_s": "extract_tokens_per_s",
}


def _probe_line(probe: dict[str, Any] | None) -> str:
    if not probe:
        return " (stated, not probed)"
    return (
        f" (probe: {probe['method']}, {probe['readers']} reader(s), {probe['bytes'] / GB:.1f} GB "
        f"in {probe['read_seconds']} s; write {probe['write_gb_per_s']} GB/s)"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", type=Path, help="the merged OUT.jsonl (its token count)")
    p.add_argument("--tokens", type=int, help="token count instead of --dataset")
    p.add_argument(
        "--from",
        dest="from_plan",
        type=Path,
        help="a recorded plan JSON: its inputs (tokens, sizes, epochs, rates, assumptions) are "
        "taken unless given here; e.g. re-plan bench/results/production-plan.json with --probe",
    )
    p.add_argument("--hidden", type=int, help="target hidden size (default 7168, Kimi-K2.5)")
    p.add_argument("--aux-layers", type=int, help="aux capture layers (default 3)")
    p.add_argument("--epochs", type=float, help="training epochs (default 3)")
    p.add_argument("--train-tokens-per-s", type=float, help="the box's drafter training rate")
    p.add_argument("--extract-tokens-per-s", type=float, help="the box's prefill dump rate")
    p.add_argument(
        "--probe",
        type=Path,
        help="measure the sustained read bandwidth of this directory's volume (O_DIRECT reads "
        "where the file system allows, else posix_fadvise DONTNEED; the method is reported)",
    )
    p.add_argument("--probe-mb", type=int, default=512, help="probe file size, MiB")
    p.add_argument(
        "--probe-readers",
        type=int,
        default=1,
        help="threads reading the probe file at once, each its share (the trainer's ranks)",
    )
    p.add_argument("--read-gbps", type=float, help="the volume's read bandwidth, if known")
    p.add_argument("--assume", action="append", default=[], help="KEY=TEXT recorded as stated")
    p.add_argument(
        "--aux-dtype",
        choices=("bf16", "fp8_e4m3"),
        default=RECOMMENDED_AUX,
        help="the planned format (default fp8_e4m3: acceptance unchanged in the fp8-aux A/B, "
        "bench/results/fp8-aux-ab.json)",
    )
    p.add_argument(
        "--strict", action="store_true", help="exit 1 when the planned format is disk-bound"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", type=Path, help="write the plan JSON here")


def command_line(args: argparse.Namespace) -> str:
    """The command as given (options at their defaults left out), for the plan's record."""
    import shlex

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    words = ["python", "-m", "remote_agent.eagle3", "plan"]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value == action.default or value is None:
            continue
        flag = action.option_strings[-1] if action.dest == "from_plan" else action.option_strings[0]
        if isinstance(value, bool):
            words.append(flag)
        elif isinstance(value, list):
            for v in value:
                words += [flag, str(v)]
        else:
            words += [flag, str(value)]
    return shlex.join(words)


def machine(probe_dir: Path | None = None) -> dict[str, Any]:
    """The box the plan was made on (stdlib only): host, CPUs, memory, GPUs, the probed volume."""
    import platform
    import shutil
    import subprocess

    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gb"] = round(int(line.split()[1]) * 1024 / GB, 1)
    except (OSError, ValueError, IndexError):
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
            info["gpus"] = [g.strip() for g in out.splitlines() if g.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    if probe_dir is not None:
        info["probe_volume"] = _volume(probe_dir)
    return info


def _volume(directory: Path) -> dict[str, Any]:
    """The mount holding `directory` (/proc/self/mounts: the longest matching mount point)."""
    real = str(Path(directory).resolve())
    best: dict[str, Any] = {}
    try:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            mnt = mnt.replace("\\040", " ")
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best.get("mount", "")):
                best = {"mount": mnt, "device": dev, "fstype": fstype}
    except (OSError, ValueError):
        pass
    try:
        st = os.statvfs(directory)
        best["free_gb"] = round(st.f_bavail * st.f_frsize / GB, 1)
    except OSError:
        pass
    return best


def summary(plan: dict[str, Any]) -> str:
    """One paragraph: what the run costs and whether the disk keeps up."""
    f = plan["formats"]
    b, q = f["bf16"], f["fp8_e4m3"]
    read = plan["disk_read_gb_per_s"]
    probe = plan.get("probe")
    source = (
        f"measured ({probe['method']}, {probe['readers']} reader(s), {probe['bytes'] / GB:.1f} GB)"
        if probe
        else "stated"
    )
    head = (
        f"{plan['tokens'] / 1e6:.1f}M tokens, {plan['epochs']:g} epochs: {b['dump_tb']} TB of "
        f"bf16 dumps ({q['dump_tb']} TB with fp8 aux), extraction ~{plan['extraction_hours']} h "
        f"at {plan['extract_tokens_per_s']:,.0f} tokens/s, training {plan['training_hours']} h "
        f"if reads kept up; it needs {b['train_read_gb_per_s_needed']} GB/s "
        f"({q['train_read_gb_per_s_needed']} GB/s fp8)"
    )
    if read is None:
        return head + ": no disk read bandwidth, so no verdict"
    tail = f" against {read} GB/s {source}"
    if not b["disk_bound"]:
        return head + tail + ": not disk-bound"
    if not q["disk_bound"]:
        return head + tail + ": disk-bound with bf16 aux, not with fp8 aux"
    return (
        head + tail + f": disk-bound, ~{b['train_hours_at_disk_pace']} h at the disk's pace "
        f"with bf16 (~{q['train_hours_at_disk_pace']} h with fp8); a >= "
        f"{b['train_read_gb_per_s_needed']:.1f} GB/s volume or the online mode removes the wait"
    )


def not_measured(plan: dict[str, Any]) -> str:
    parts = [f"{k} ({v})" for k, v in plan["assumptions"].items()]
    if plan.get("probe") is None:
        parts.append(
            "the disk read bandwidth: no --probe ran (the runbook's plan step probes the rented "
            "box's volume before extraction)"
        )
    return "; ".join(parts) if parts else "nothing: every input was measured"


def run(args: argparse.Namespace) -> int:
    given = command_line(args)  # as typed, before --from and the defaults fill the rest
    recorded: dict[str, Any] = {}
    if args.from_plan is not None:
        try:
            recorded = json.loads(Path(args.from_plan).read_text())
        except (OSError, ValueError) as exc:
            raise BadInput(f"--from {args.from_plan}: {exc}") from None
        for key, dest in FROM_KEYS.items():
            if getattr(args, dest) is None and recorded.get(key) is not None:
                setattr(args, dest, recorded[key])
        if args.dataset is None and args.tokens is None and recorded.get("dataset"):
            args.dataset = Path(recorded["dataset"])
    for dest, value in DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    tokens, dataset = args.tokens, args.dataset
    if tokens is None and dataset is None:
        raise BadInput("plan needs --dataset OUT.jsonl, --tokens N or --from PLAN.json")
    if args.train_tokens_per_s is None or args.extract_tokens_per_s is None:
        raise BadInput("plan needs --train-tokens-per-s and --extract-tokens-per-s (or --from)")
    if tokens is None:
        from remote_agent.eagle3.extraction.dataset import open_dataset

        tokens = open_dataset(Path(str(dataset)), require_manifest=False).total_tokens()
    if tokens <= 0 or args.train_tokens_per_s <= 0 or args.extract_tokens_per_s <= 0:
        raise BadInput("tokens and rates must be positive")
    if args.probe_readers < 1 or args.probe_mb < 1:
        raise BadInput("--probe-mb and --probe-readers must be positive")
    probe = probe_read_gbps(args.probe, args.probe_mb, args.probe_readers) if args.probe else None
    read = probe["read_gb_per_s"] if probe else args.read_gbps
    if read is None and args.from_plan is not None:
        read = recorded.get("disk_read_gb_per_s")
    assumptions = dict(recorded.get("assumptions") or {})
    if probe:  # the disk is measured now: its earlier assumption no longer holds
        assumptions.pop("disk_read_gb_per_s", None)
    assumptions.update(a.split("=", 1) for a in args.assume if "=" in a)
    plan = make_plan(
        tokens,
        args.hidden,
        args.aux_layers,
        args.epochs,
        args.train_tokens_per_s,
        args.extract_tokens_per_s,
        read,
        assumptions,
    )
    plan["command"] = given
    plan["planned_format"] = args.aux_dtype
    plan["recommended_format"] = {"aux_dtype": RECOMMENDED_AUX, "why": RECOMMENDED_WHY}
    if probe:
        plan["probe"] = probe
        plan["measured"] = {
            "disk_read_gb_per_s": f"{read} GB/s: the probe of {probe['dir']} ({probe['method']}, "
            f"{probe['readers']} reader(s), {probe['bytes'] / GB:.1f} GB) on this machine"
        }
    plan["not_measured"] = not_measured(plan)
    plan["summary"] = summary(plan)
    plan["machine"] = machine(args.probe)
    if args.dataset:
        plan["dataset"] = str(args.dataset)
    if args.out:
        from remote_agent.eagle3.atomic import write_bytes_atomic

        write_bytes_atomic(args.out, (json.dumps(plan, indent=1) + "\n").encode())
    print(json.dumps(plan, indent=1) if args.json else render(plan))
    from remote_agent.eagle3.progress import emit

    emit("result", stage="plan", verdict=plan["verdict"], tokens=tokens)
    bound = plan["formats"][args.aux_dtype]["disk_bound"]
    if bound:
        print(f"{'BLOCKED' if args.strict else 'WARNING'}: {args.aux_dtype} training is disk-bound")
    return 1 if args.strict and bound else 0
