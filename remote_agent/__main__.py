"""`python -m remote_agent [serve] [--spool DIR]` | `... jobwrap JOBDIR` | `... delete JOBDIR`.

Also the entry point of the zipapp (`python agent.pyz serve`): build it with
`zipapp.create_archive(src, dest, main="remote_agent.__main__:entry")`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from remote_agent import __version__


def serve(spool_dir: str | None) -> int:
    from remote_agent.agent.server import Server
    from remote_agent.agent.spool import Spool, default_root

    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("EAGLE_TUI_AGENT_LOG", "INFO").upper(),
        format="remote_agent[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    spool = Spool(Path(spool_dir) if spool_dir else default_root())
    try:
        spool.ensure()
    except OSError as e:  # `hello` tries again and answers with the reason (spool_unusable)
        logging.getLogger("remote_agent").error("spool %s: %s", spool.root, e)
    # The agent lives as long as its connection: a hangup ends it (its detached jobs run on).
    # An ignore inherited from the launcher (nohup, a daemon) would keep it waiting for EOF.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    # The protocol gets private copies of stdin/stdout; fds 0 and 1 become /dev/null and
    # stderr, so a stray print or an inherited fd can never corrupt the protocol stream.
    in_fd, out_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return Server(spool, in_fd, out_fd).serve()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "jobwrap":
        from remote_agent.agent import jobwrap

        return jobwrap.main(argv[1:])
    if argv and argv[0] == "delete":
        from remote_agent.agent import deletion

        return deletion.main(argv[1:])
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv.insert(0, "serve")
    parser = argparse.ArgumentParser(prog="python -m remote_agent", description=__doc__)
    parser.add_argument("--version", action="version", version=f"remote_agent {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_serve = sub.add_parser("serve", help="speak the JSON-lines protocol on stdin/stdout")
    p_serve.add_argument(
        "--spool", help="spool root (default $EAGLE_TUI_SPOOL or ~/.eagle-tui/spool)"
    )
    sub.add_parser("jobwrap", help="internal: the per-job supervisor")
    sub.add_parser("delete", help="internal: a delete step's job (remote_agent/agent/deletion.py)")
    args = parser.parse_args(argv)
    return serve(args.spool)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
