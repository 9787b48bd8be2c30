"""A crashed extraction server is detected and restarted by the runbook engine (real CLI, real
local agent, real processes), bounded and audited, and the step that uses it resumes.

The server here is a stand-in: a tiny stdlib HTTP server (SERVER) that crashes (os._exit 3)
on a chosen request, in its first incarnation(s) only. It stands in ONLY as the thing that
dies; the engine, agent, jobs, retries and audit are the real ones. The consumer (WORKER) is
resumable like `eagle3 extract`: it records each item the server acknowledged and skips those
on a relaunch, and exits 1 when the server goes away (as extract does after its retries).
The last test runs the real `eagle3 extract` and `verify-dumps` against the extraction tests'
SGLang stand-in (real hook, real tiny model) as a process that crashes mid-extraction.
"""

from __future__ import annotations

import re
import socket
import sys
import textwrap
from pathlib import Path

from runbook.loader import load_text
from tests.runbook.conftest import Cli
from tests.support.paths import REPO

SERVER = """\
import http.server, os, sys
port, work, crash_at, crashes = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
life_file = os.path.join(work, "lives")
lives = int(open(life_file).read()) + 1 if os.path.exists(life_file) else 1
open(life_file, "w").write(str(lives))
seen = [0]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path.startswith("/item/"):
            seen[0] += 1
            if lives <= crashes and seen[0] == crash_at:
                os._exit(3)  # crash mid-request: no answer
            with open(os.path.join(work, "served"), "a") as f:
                f.write(self.path.rsplit("/", 1)[1] + "\\n")
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""

WORKER = """\
import os, sys, urllib.request
port, work, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
done_file = os.path.join(work, "done")
done = set(open(done_file).read().split()) if os.path.exists(done_file) else set()
for i in range(n):
    if str(i) in done:
        continue
    try:
        urllib.request.urlopen("http://127.0.0.1:%d/item/%d" % (port, i), timeout=10).read()
    except OSError as exc:
        print("server gone at item %d: %s" % (i, exc)); sys.exit(1)
    with open(done_file, "a") as f:
        f.write("%d\\n" % i)
print("all %d items done" % n)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runbook(cli: Cli, work: Path, crashes: int, restarts: int, n: int = 12) -> Path:
    (work / "server.py").write_text(SERVER)
    (work / "worker.py").write_text(WORKER)
    port = _port()
    return cli.runbook(f"""\
        name: restart
        steps:
          - id: server
            title: Extraction server (stand-in that crashes)
            run: [python3, "{work / "server.py"}", "{port}", "{work}", "5", "{crashes}"]
            detach: true
            service:
              ready: {{check: http_ok, url: "http://127.0.0.1:{port}/health"}}
              interval: 0.2s
              timeout: 30s
              restarts: {restarts}
          - id: work
            title: Resumable client of the server
            run: [python3, "{work / "worker.py"}", "{port}", "{work}", "{n}"]
            requires: [server]
            uses: [server]
            retry: {{max: 4, on: [1], backoff: 0.2s}}
            idempotent: true
          - id: stop-server
            title: Stop it
            stop: server
            requires: [work]
    """)


def test_a_crashed_server_is_restarted_and_the_work_resumes(tmp_path, tally) -> None:
    cli = Cli(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    rb = _runbook(cli, work, crashes=2, restarts=3)
    out = cli("run", str(rb), "--auto", timeout=180)
    st = cli.state_json()["steps"]
    assert tally.trial("restart: run completes after two crashes", out.returncode == 0), (
        out.stdout[-2000:] + out.stderr[-2000:]
    )
    served = (work / "served").read_text().split()
    held = sorted(served, key=int) == [str(i) for i in range(12)] and len(served) == 12
    assert tally.trial("restart: every item exactly once across incarnations", held)
    assert tally.trial("restart: three server lives", (work / "lives").read_text() == "3")
    held = st["server"]["restarts"] == 2 and st["server"]["job_id"].endswith(".server.3")
    assert tally.trial("restart: service record counts restarts", held)
    events = [r for r in cli.audit() if r["event"] == "service.restarted"]
    held = [e["restart"] for e in events] == [1, 2] and all(
        e["died_exit"]["exit_code"] == 3 and e["for_step"] == "work" and e["limit"] == 3
        for e in events
    )
    assert tally.trial("restart: each restart audited with the exit", held)
    assert tally.trial(
        "restart: stop step stops the new job", st["stop-server"]["reason"] == "service_stopped"
    )


def test_restarts_are_bounded(tmp_path, tally) -> None:
    cli = Cli(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    rb = _runbook(cli, work, crashes=99, restarts=1)
    out = cli("run", str(rb), "--auto", timeout=180)
    st = cli.state_json()["steps"]
    held = out.returncode == 1 and st["work"]["reason"] == "service_died"
    assert tally.trial("restart: bounded, then the step fails", held), out.stdout[-2000:]
    held = "1 of 1 restarts used" in st["work"]["message"]
    assert tally.trial("restart: the failure says why", held)
    events = [r for r in cli.audit() if r["event"] == "service.restarted"]
    assert tally.trial("restart: exactly the allowed restarts", len(events) == 1)
    assert tally.trial("restart: two server lives", (work / "lives").read_text() == "2")


def test_uses_must_name_a_required_service(tmp_path, tally) -> None:
    cli = Cli(tmp_path)
    base = """\
        name: t
        steps:
          - {id: s, title: S, run: "sleep 1", detach: true, service: {ready: {check: path_exists, path: /}}}
          - {id: a, title: A, run: "true"}
    """
    for bad, why in (
        ("  - {id: b, title: B, run: 'true', uses: [a], requires: [a]}", "not a service step"),
        ("  - {id: b, title: B, run: 'true', uses: [s]}", "must be among the steps"),
        ("  - {id: b, title: B, run: 'true', uses: [zz], requires: [s]}", "unknown step"),
    ):
        rb = cli.runbook(textwrap.dedent(base) + bad + "\n", "bad.yaml")
        out = cli("validate", str(rb))
        held = out.returncode == 2 and why in (out.stdout + out.stderr)
        assert tally.trial("restart: uses validated", held), out.stdout + out.stderr


def test_the_production_runbook_restarts_its_extraction_server(tally) -> None:
    path = REPO / "runbooks" / "kimi-k25-eagle3.yaml"
    rb = load_text(path.read_text(), str(path)).runbook
    held = rb.step("extraction-server").service.restarts >= 1
    held &= all("extraction-server" in rb.step(s).uses for s in ("canary", "extract"))
    held &= 1 in rb.step("extract").retry.on  # extract exits 1 when the server died
    assert tally.trial("restart: production runbook wired", held)


# the SGLang stand-in of tests/eagle3/extraction (real hook, real tiny model), as a process on
# a fixed port that crashes after `crash_at` dumped samples in its first life
FAKE_SGLANG = """\
import os, sys, threading, time
from http.server import ThreadingHTTPServer
from pathlib import Path
repo, port, model, work, crash_at = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
sys.path[:0] = [repo, os.path.join(repo, "tests", "eagle3", "extraction")]
from eagle3_standins import FakeSGLang, load_hook_package
lives = int((work / "lives").read_text()) + 1 if (work / "lives").exists() else 1
(work / "lives").write_text(str(lives))
hook = load_hook_package(work / ("hook-%d" % lives))
hook._writer_rank = lambda model: 0  # no sglang here: this process is the one writer
fake = FakeSGLang(hook, model)
fake._httpd.server_close()  # the runbook needs a known port
fake._httpd = ThreadingHTTPServer(("127.0.0.1", port), fake._handler())
fake._threads[0] = threading.Thread(target=fake._httpd.serve_forever, daemon=True)
forward, seen = fake._forward, [0]
def crashing(pieces):
    forward(pieces)
    seen[0] += sum("__eagle3__" not in r.rid for r, _, _ in pieces)
    if lives == 1 and seen[0] >= crash_at:
        # the hook seals a partial shard FLUSH_S (0.5 s) after its last write: let it seal what
        # was dumped so far (so the resume has something to skip), then die with replies unsent
        time.sleep(2.0)
        os._exit(3)
fake._forward = crashing
with fake:
    while True:
        time.sleep(1)
"""


def _greedy_dataset(path: Path, target: Path, lengths: list[int]) -> Path:
    """Samples the tiny target continues greedily after a 4-token random prompt: verify-dumps'
    final-state check (`--model`, at least 10% of supervised rows predict the next token) then
    passes only for the target's own final states (random ids agree at chance, ~1/vocab)."""
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(REPO / "tests" / "eagle3" / "extraction"))
    from eagle3_standins import write_records

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    records = []
    for i, n in enumerate(lengths):
        ids = torch.randint(11, 1500, (1, 4), generator=g)
        with torch.no_grad():
            seq = model.generate(ids, max_new_tokens=n - 4, min_new_tokens=n - 4, do_sample=False)
        seq = seq[0].tolist()[:n]
        mask = [0] * 4 + [1] * (n - 4)
        records.append({"id": f"s{i:04d}", "source": "greedy", "input_ids": seq, "loss_mask": mask})
    return write_records(path, records)


def test_real_extract_resumes_against_a_restarted_server(tmp_path, tiny_target, tally) -> None:
    cli = Cli(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "fake_sglang.py").write_text(FAKE_SGLANG)
    lengths = [12, 30, 7, 25, 18, 9, 22, 15, 11, 28, 6, 19]
    data = _greedy_dataset(tmp_path / "d.jsonl", tiny_target, lengths)
    out, port, py = tmp_path / "dump", _port(), sys.executable
    url = f"http://127.0.0.1:{port}"
    hook_env = f"{{EAGLE3_DUMP_DIR: '{out}', EAGLE3_DUMP_SHARD_MB: '0.05', EAGLE3_DUMP_FLUSH_S: '0.5', EAGLE3_DUMP_MIN_FREE_MB: '0'}}"
    rb = cli.runbook(f"""\
        name: extract-restart
        steps:
          - id: extraction-server
            title: SGLang stand-in that crashes mid-extraction
            run: ["{py}", "{work / "fake_sglang.py"}", "{REPO}", "{port}", "{tiny_target}", "{work}", "5"]
            env: {hook_env}
            detach: true
            service:
              ready: {{check: http_ok, url: "{url}/health"}}
              interval: 0.5s
              timeout: 120s
              restarts: 2
          - id: extract
            title: The real extraction client
            run: ["{py}", -m, remote_agent.eagle3, extract, --server, "{url}", --dataset, "{data}", --out, "{out}", --model, "{tiny_target}", --disk-margin-gb, "0", --concurrency, "2", --retries, "1", --canary-timeout, "60", --dump-timeout, "60"]
            requires: [extraction-server]
            uses: [extraction-server]
            retry: {{max: 3, on: [1], backoff: 0.5s}}
            idempotent: true
          - id: stop
            title: Stop the server
            stop: extraction-server
            requires: [extract]
          - id: verify-dumps
            title: Every sample exactly once, ids equal, no NaN
            run: ["{py}", -m, remote_agent.eagle3, verify-dumps, "{out}", --dataset, "{data}", --model, "{tiny_target}"]
            requires: [stop]
    """)
    out_run = cli("run", str(rb), "--auto", timeout=400)
    st = cli.state_json()["steps"]
    ok = out_run.returncode == 0
    assert tally.trial("restart: real extract finishes after a crash", ok), (
        out_run.stdout[-3000:] + out_run.stderr[-2000:]
    )
    held = st["extract"]["attempt"] >= 2 and st["extraction-server"]["restarts"] == 1
    assert tally.trial("restart: extract retried against the restarted server", held)
    held = st["verify-dumps"]["status"] == "succeeded"
    # and the dumped final states are the target's own (greedy data: nearly every row agrees)
    agree = re.search(
        r"final-state check: (\d+)/(\d+) sampled rows", open(st["verify-dumps"]["log_file"]).read()
    )
    held = held and agree is not None and int(agree[1]) >= 0.9 * int(agree[2]) > 0
    assert tally.trial("restart: resumed dump verifies (each sample once)", held)
    log = open(st["extract"]["log_file"]).read()  # the last attempt's
    done = [int(n) for n in re.findall(r"to dump, (\d+) already done", log)]
    held = len(done) == 1 and 0 < done[0] < len(lengths)  # resumed mid-way, not from scratch
    assert tally.trial("restart: the resume skipped the dumped samples", held), log[-2000:]


KILLER = """\
import glob, os, signal, sys, time
for d in glob.glob(os.path.join(sys.argv[1], "jobs", "*.server.1")):
    for name in ("pid", "pgid"):  # the supervisor, then the server's group: no record left
        pid = int(open(os.path.join(d, name)).read().split()[0])
        try:
            os.killpg(pid, signal.SIGKILL) if name == "pgid" else os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
time.sleep(1)
"""


def test_a_lost_service_is_restarted_only_when_idempotent(tmp_path, tally) -> None:
    """Killing supervisor and server at once leaves the job's fate unknown (`lost`): like any
    lost job it is never launched twice unless its step says `idempotent: true`."""
    for idempotent in (False, True):
        root = tmp_path / f"idem-{idempotent}"
        root.mkdir()
        cli = Cli(root)
        work = root / "work"
        work.mkdir()
        (work / "server.py").write_text(SERVER)
        (work / "worker.py").write_text(WORKER)
        (work / "killer.py").write_text(KILLER)
        port = _port()
        rb = cli.runbook(f"""\
            name: lost
            steps:
              - id: server
                title: Server
                run: [python3, "{work / "server.py"}", "{port}", "{work}", "0", "0"]
                detach: true
                idempotent: {str(idempotent).lower()}
                service:
                  ready: {{check: http_ok, url: "http://127.0.0.1:{port}/health"}}
                  interval: 0.2s
                  restarts: 2
              - id: kill
                title: Lose it (SIGKILL supervisor and server)
                run: [python3, "{work / "killer.py"}", "{root / "spool"}"]
                requires: [server]
              - id: work
                title: Client
                run: [python3, "{work / "worker.py"}", "{port}", "{work}", "3"]
                requires: [kill]
                uses: [server]
              - id: stop
                title: Stop it
                stop: server
                requires: [work]
        """)
        out = cli("run", str(rb), "--auto", timeout=120)
        st = cli.state_json()["steps"]
        lives = (work / "lives").read_text()
        if idempotent:
            held = out.returncode == 0 and st["server"]["restarts"] == 1 and lives == "2"
            assert tally.trial("restart: lost + idempotent restarted", held), out.stdout[-2000:]
        else:
            held = out.returncode == 1 and st["work"]["reason"] == "service_lost"
            held &= lives == "1" and st["server"]["restarts"] == 0
            assert tally.trial("restart: lost, not idempotent, never relaunched", held), out.stdout[
                -2000:
            ] + str(st["work"])
