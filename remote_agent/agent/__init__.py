"""The agent core: what runs on the box, standard library only (tests/runbook/test_import_hygiene.py).

The server and its ops (`server.py`, PROTOCOL.md), jobs and their supervisors (`jobs.py`,
`jobwrap.py`, `jobleader.py`, `jobenv.py`, `launchguard.py`, `logwatch.py`, `procs.py`), the
spool (`spool.py`), probes, stats and the GPU reading (`probes.py`, `stats.py`, `gpu.py`), the
driver locks (`driver_locks.py`) and the delete job (`deletion.py`). It imports the wire
contracts (`remote_agent/wire/`), never the payload (`remote_agent/eagle3/`); nothing outside
`remote_agent/` imports it but the entry point (`remote_agent/__main__.py`), tests and bench.
"""
