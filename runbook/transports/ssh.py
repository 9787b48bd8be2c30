"""The `ssh` transport (asyncssh): reach a box, bootstrap the agent there, hand out one channel.

`open()` (called by `HostSession` on first use and after every lost connection):
1. (re)connects when there is no live SSH connection: `[user@]host[:port]` or a ~/.ssh/config
   alias (HostName, User, Port, IdentityFile, ProxyJump, ServerAliveInterval, ConnectTimeout
   honoured), keys from the SSH agent or IdentityFile, strict host keys (hostkeys.py), keepalive
   15 s x 3 unless the config sets ServerAliveInterval (a dead link must end reads: asyncssh
   has none by default), a connect timeout; jump hosts are connected here, hop by hop, so they
   get the same known_hosts and keepalive as the box (asyncssh's own ProxyJump would not);
2. probes the box in one exec: the python (>= 3.10), $HOME, whether the agent archive of this
   content hash is already there;
3. uploads the archive over SFTP only when it is missing (tmp name + rename, mode 0600) and
   unpacks it next to itself (`agent-<hash>/`, once);
4. starts `python agent-<hash>/ serve [--spool S]` on a new channel (no PTY) and returns it.

One agent channel per connection, plus short exec/SFTP channels during bootstrap: far below
OpenSSH's MaxSessions (10). Authentication, host-key and configuration failures are permanent
(`HostSession` does not retry them); network failures are not.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from runbook.transports import Endpoint, TransportError, TransportOptions
from runbook.transports.bundle import Bundle, build
from runbook.transports.hostkeys import KnownHosts, VerifyingClient, fingerprint
from runbook.transports.local import STREAM_LIMIT
from runbook.transports.ssh_channel import AgentSession, SshChannel
from runbook.transports.ssh_target import parse_target, ssh_command, unreachable_hint

__all__ = ["SshTransport", "parse_target", "ssh_command", "unreachable_hint"]

DEFAULT_KEEPALIVE = (15.0, 3)  # interval (s), missed replies before the link counts as dead
# Every connection phase has its own bound and names itself when it runs out (issue 28): a
# name that does not resolve, an address that drops packets, a port that accepts TCP but never
# speaks SSH, a box that never finishes authentication, an agent that never starts.
RESOLVE_TIMEOUT = 10.0  # DNS
DEFAULT_CONNECT_TIMEOUT = 20.0  # TCP connect; then again for the SSH handshake + auth
# (`ConnectTimeout` in the ssh config sets both, as OpenSSH's does)
REMOTE_DIR = ".cache/eagle-tui"  # under the box's $HOME
MIN_PYTHON = (3, 10)
OP_TIMEOUT = 120.0  # each agent-start phase (probe, upload, unpack, start); keepalive is sooner
MAX_HOPS = 5

# Unpacks the archive into `agent-<hash>/` next to it (tmp dir + rename: concurrent clients
# never see half a tree). The agent and its jobs run from that tree, not from the zip: the
# payload finds `patches/` and its helper sources through `__file__`, which a zip member
# cannot serve as files.
_UNPACK = """\
import os, shutil, sys, tempfile, zipfile
src, dst = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix=".unpack-", dir=os.path.dirname(dst))
with zipfile.ZipFile(src) as z:
    z.extractall(os.path.join(tmp, "tree"))
try:
    os.rename(os.path.join(tmp, "tree"), dst)
except OSError:
    pass
shutil.rmtree(tmp, ignore_errors=True)
"""


def remote_path(path: str) -> str:
    """A path for the box's shell: quoted, with a leading `~/` kept as $HOME."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def sh(script: str) -> str:
    """Run `script` with /bin/sh whatever the login shell is (fish and csh parse it too)."""
    return f"exec /bin/sh -c {shlex.quote(script)}"


@dataclass(frozen=True)
class _Resolved:
    """What the ssh config says about one target (asyncssh applies it; we decide around it)."""

    host: str
    port: int
    user: str
    jumps: tuple[str, ...]
    keepalive_set: bool
    count_max_set: bool
    timeout: float | None  # the config's ConnectTimeout


@dataclass(frozen=True)
class _BoxInfo:
    home: str
    have_archive: bool
    have_tree: bool


class SshTransport:
    def __init__(
        self,
        name: str,
        target: str,
        state_dir: Path,
        *,
        known_hosts: Path | None = None,
        ssh_config: list[str] | None = None,
        trusted: Callable[[], Iterable[str]] = lambda: (),
        python: str = "python3",
        spool: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        keepalive: tuple[float, int] = DEFAULT_KEEPALIVE,
    ) -> None:
        self.name = name
        self.target = target
        self.state_dir = Path(state_dir)
        self.known_hosts = KnownHosts(Path(known_hosts or Path("~/.ssh/known_hosts")).expanduser())
        self.ssh_config = ssh_config  # None: asyncssh's default (~/.ssh/config when readable)
        self._trusted = trusted
        self._extra_trust: set[str] = set()
        self.python = python
        self.spool = spool
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.endpoint = Endpoint("ssh", name)
        self._conns: list[asyncssh.SSHClientConnection] = []  # jump hops first, the box last
        self._session: AgentSession | None = None
        self._bundle: Bundle | None = None

    @classmethod
    def from_options(
        cls,
        host: str,
        state_dir: Path,
        options: TransportOptions | None = None,
        config: Any = None,
    ) -> SshTransport:
        """From the CLI's options (known_hosts, ssh_config, trust_host) and, for a host named in
        the runbook's `hosts:`, its HostConfig (ssh target, python, spool)."""
        options = options or TransportOptions()
        trusted = options.trust_host
        return cls(
            host,
            getattr(config, "ssh", None) or host,
            state_dir,
            known_hosts=Path(options.known_hosts) if options.known_hosts else None,
            ssh_config=[options.ssh_config] if options.ssh_config else None,
            trusted=lambda: trusted,
            # a `hosts:` entry's python; else `--python` (for `--host user@box`); else python3
            python=getattr(config, "python", None) or options.python or "python3",
            spool=getattr(config, "spool", None),
        )

    def trust(self, fingerprint: str) -> None:
        """Accept this fingerprint for an unknown host on the next `open()` (a UI's "trust")."""
        self._extra_trust.add(fingerprint)

    def trusted(self) -> set[str]:
        return set(self._trusted()) | self._extra_trust

    # ------------------------------------------------------------------ open / close
    async def open(self) -> SshChannel:
        self._check_last_agent()
        conn = await self._connection()
        phase = "probing the box's python"
        try:
            bundle = await self._bundle_now()
            info = await asyncio.wait_for(self._probe(conn, bundle), OP_TIMEOUT)
            if not info.have_archive:
                phase = "uploading the agent"
                await asyncio.wait_for(self._upload(conn, info, bundle), OP_TIMEOUT)
            if not info.have_tree:
                phase = "unpacking the agent"
                await asyncio.wait_for(self._unpack(conn, info, bundle), OP_TIMEOUT)
            phase = "starting the agent"
            return await asyncio.wait_for(self._start_agent(conn, info, bundle), OP_TIMEOUT)
        except TransportError:
            raise
        except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
            await self._drop()  # the next open() starts from a fresh connection
            why = (
                f"did not finish within {OP_TIMEOUT:g} s"
                if isinstance(exc, asyncio.TimeoutError)
                else f"failed: {_describe(exc)}"
            )
            raise TransportError(f"{self.name}: agent start: {phase} {why}") from exc

    async def close(self) -> None:
        await self._drop()

    async def _drop(self) -> None:
        conns, self._conns = self._conns, []
        for conn in reversed(conns):
            conn.close()
        for conn in reversed(conns):
            try:
                await asyncio.wait_for(conn.wait_closed(), 5)
            except (asyncio.TimeoutError, Exception):
                pass

    def _alive(self) -> bool:
        return bool(self._conns) and not any(c.is_closed() for c in self._conns)

    # ------------------------------------------------------------------ connecting
    async def _connection(self) -> asyncssh.SSHClientConnection:
        if self._alive():
            return self._conns[-1]
        await self._drop()
        conns: list[asyncssh.SSHClientConnection] = []
        try:
            conn = await self._connect(self.target, None, conns, 0)
        except BaseException:
            for c in reversed(conns):
                c.close()
            raise
        self._conns = conns
        key = conn.get_server_host_key()
        self.endpoint = Endpoint("ssh", self.name, fingerprint(key) if key else None)
        return conn

    async def _resolve(self, spec: str) -> tuple[_Resolved, dict[str, Any]]:
        user, host, port = parse_target(spec)
        kwargs: dict[str, Any] = {"host": host}
        if port is not None:
            kwargs["port"] = port
        if user is not None:
            kwargs["username"] = user
        kwargs["config"] = self.ssh_config if self.ssh_config is not None else ()
        try:
            opts = await asyncssh.SSHClientConnectionOptions.construct(**kwargs)
        except (ValueError, OSError, asyncssh.Error) as exc:
            raise TransportError(
                f"{self.name}: ssh configuration for {spec!r}: {exc}", permanent=True
            ) from exc
        cfg = opts.config
        jump = opts.tunnel if isinstance(opts.tunnel, str) else None
        jumps = tuple(
            j.strip() for j in (jump or "").split(",") if j.strip() and j.strip().lower() != "none"
        )
        return (
            _Resolved(
                host=opts.host,
                port=opts.port,
                user=opts.username,
                jumps=jumps,
                keepalive_set=cfg.get("ServerAliveInterval") is not None,
                count_max_set=cfg.get("ServerAliveCountMax") is not None,
                timeout=cfg.get("ConnectTimeout"),
            ),
            kwargs,
        )

    async def _connect(
        self,
        spec: str,
        via: asyncssh.SSHClientConnection | None,
        conns: list[asyncssh.SSHClientConnection],
        depth: int,
    ) -> asyncssh.SSHClientConnection:
        if depth > MAX_HOPS:
            raise TransportError(f"{self.name}: more than {MAX_HOPS} ProxyJump hops", True)
        res, kwargs = await self._resolve(spec)
        if via is None:
            for hop in res.jumps:  # the box's ProxyJump chain, each hop verified like the box
                via = await self._connect(hop, via, conns, depth + 1)
        label = f"{self.name} (jump host {spec})" if depth else self.name
        client = VerifyingClient(label, self.known_hosts, self.trusted)
        if not res.keepalive_set:
            kwargs["keepalive_interval"] = self.keepalive[0]
            if not res.count_max_set:
                kwargs["keepalive_count_max"] = self.keepalive[1]
        timeout = float(res.timeout if res.timeout is not None else self.connect_timeout)
        kwargs["connect_timeout"] = timeout
        where = f"{res.user}@{res.host}:{res.port}" + (f" (jump host {spec})" if depth else "")
        # "gpu8 (root@10.0.0.8:22)", or just the name when it is that target already
        at = self.name if where in (self.name, f"{self.name}:22") else f"{self.name} ({where})"
        sock = None
        if via is None:  # direct: resolve and connect ourselves, each phase with its own bound
            sock = await self._tcp(res, at, timeout)
        try:
            conn = await asyncio.wait_for(
                asyncssh.connect(
                    **kwargs,
                    tunnel=via,  # None: direct (our hops above replace the config's ProxyJump)
                    sock=sock,
                    known_hosts=self.known_hosts.match,
                    client_factory=lambda: client,
                ),
                timeout + 5,  # asyncssh's own connect_timeout ends it first; this is a backstop
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise client.refusal or TransportError(
                f"{self.name}: host key of {where} refused: {exc}", permanent=True
            ) from exc
        except asyncssh.PermissionDenied as exc:
            raise TransportError(
                f"{self.name}: authentication failed for {where}: {exc.reason or exc}. "
                "Check the user name and that your key (ssh-agent or IdentityFile) is in the "
                "box's authorized_keys; not retrying.",
                permanent=True,
            ) from exc
        except asyncssh.KeyExchangeFailed as exc:
            raise TransportError(
                f"{self.name}: no common key exchange with {where}: {exc}", permanent=True
            ) from exc
        except socket.gaierror as exc:
            permanent = exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5))
            raise TransportError(
                f"{self.name}: cannot resolve {res.host!r}: {exc.strerror}", permanent=permanent
            ) from exc
        except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
            if sock is not None:
                sock.close()
            if isinstance(exc, asyncio.TimeoutError) and via is None:
                phase = (
                    f"SSH authentication as {res.user!r} did not finish"
                    if client.authenticating
                    else "no SSH handshake (the port accepts TCP but does not answer as an "
                    "SSH server: is it the right port?)"
                )
                raise TransportError(
                    f"{at}: {phase} within {timeout:g} s (ConnectTimeout)"
                ) from exc
            raise TransportError(f"{at}: SSH connection failed: {_describe(exc)}") from exc
        except ValueError as exc:  # asyncssh's option checks (bad key file, bad algorithm...)
            raise TransportError(f"{self.name}: {where}: {exc}", permanent=True) from exc
        conns.append(conn)
        return conn

    async def _tcp(self, res: _Resolved, at: str, timeout: float) -> socket.socket:
        """Resolve (RESOLVE_TIMEOUT) and open the TCP connection (`timeout`), each failure one
        line naming its phase."""
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(res.host, res.port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT
            )
        except socket.gaierror as exc:
            permanent = exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5))
            raise TransportError(
                f"{self.name}: cannot resolve {res.host!r}: {exc.strerror}", permanent=permanent
            ) from exc
        except asyncio.TimeoutError as exc:
            raise TransportError(
                f"{self.name}: cannot resolve {res.host!r}: no answer from DNS within "
                f"{RESOLVE_TIMEOUT:g} s"
            ) from exc
        last: str = "no address"
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, addr), timeout)
                return sock
            except asyncio.TimeoutError:
                last = (
                    f"no TCP answer within {timeout:g} s (ConnectTimeout): the box is down, a "
                    "firewall drops the packets, or the address or port is wrong"
                )
            except ConnectionRefusedError:
                last = f"TCP connection refused: nothing listens on port {res.port} (sshd down?)"
            except OSError as exc:
                last = f"TCP connect failed: {exc.strerror or exc}"
            sock.close()
        raise TransportError(f"{at}: {last}")

    # ------------------------------------------------------------------ bootstrap
    async def _bundle_now(self) -> Bundle:
        if self._bundle is None:  # zipping ~1 MB of sources: off the event loop
            self._bundle = await asyncio.to_thread(build, self.state_dir / "cache")
        return self._bundle

    def _remote(self, info: _BoxInfo, bundle: Bundle) -> tuple[str, str, str]:
        d = f"{info.home.rstrip('/')}/{REMOTE_DIR}"
        return d, f"{d}/{bundle.name}", f"{d}/agent-{bundle.digest}"

    async def _probe(self, conn: asyncssh.SSHClientConnection, bundle: Bundle) -> _BoxInfo:
        py = remote_path(self.python)
        d = f'"$HOME"/{REMOTE_DIR}'
        script = (
            f"if ! command -v {py} >/dev/null 2>&1; then echo EAGLE_NOPY; exit 0; fi; "
            f"{py} -c 'import sys; print(\"EAGLE_PY\", *sys.version_info[:3])'; "
            'printf "EAGLE_HOME %s\\n" "$HOME"; '
            f"[ -f {d}/{bundle.name} ] && echo EAGLE_HAVE_PYZ; "
            f"[ -f {d}/agent-{bundle.digest}/__main__.py ] && echo EAGLE_HAVE_TREE; true"
        )
        res = await conn.run(sh(script), check=False, request_pty=False)
        out = str(res.stdout or "")
        err = str(res.stderr or "").strip()[-800:]
        lines = {ln.split(" ", 1)[0]: ln for ln in out.splitlines() if ln.startswith("EAGLE_")}
        need = "Python >= {}.{}".format(*MIN_PYTHON)
        fix = (
            f"set `python:` for this host in the runbook's `hosts:`, or pass --python PATH "
            f"(e.g. a venv's python, {need})"
        )
        if "EAGLE_NOPY" in lines:
            raise TransportError(
                f"{self.name}: no python on the box: `{self.python}` was not found; "
                f"install {need} there or {fix}",
                permanent=True,
            )
        if "EAGLE_PY" not in lines:
            raise TransportError(
                f"{self.name}: `{self.python}` on the box did not run a Python 3 check "
                f"(too old or broken): {err or out.strip()[-800:]}; {fix}",
                permanent=True,
            )
        version = tuple(int(x) for x in lines["EAGLE_PY"].split()[1:4])
        if version[:2] < MIN_PYTHON:
            raise TransportError(
                f"{self.name}: `{self.python}` on the box is Python "
                f"{'.'.join(map(str, version))}; the agent needs {need}: {fix}",
                permanent=True,
            )
        home = lines.get("EAGLE_HOME", "EAGLE_HOME ").split(" ", 1)[1]
        if not home.startswith("/"):
            raise TransportError(f"{self.name}: the box's $HOME is not set ({home!r})", True)
        return _BoxInfo(home, "EAGLE_HAVE_PYZ" in lines, "EAGLE_HAVE_TREE" in lines)

    async def _upload(
        self, conn: asyncssh.SSHClientConnection, info: _BoxInfo, bundle: Bundle
    ) -> None:
        d, final, _ = self._remote(info, bundle)
        tmp = f"{final}.tmp.{os.getpid()}.{os.urandom(4).hex()}"
        data = bundle.path.read_bytes()
        async with conn.start_sftp_client() as sftp:
            await sftp.makedirs(d, attrs=asyncssh.SFTPAttrs(permissions=0o700), exist_ok=True)
            try:
                async with sftp.open(tmp, "wb", attrs=asyncssh.SFTPAttrs(permissions=0o600)) as f:
                    await f.write(data)
                await sftp.chmod(tmp, 0o600)
                try:
                    await sftp.posix_rename(tmp, final)
                except asyncssh.SFTPOpUnsupported:
                    await sftp.rename(tmp, final)
            except BaseException:
                try:
                    await sftp.remove(tmp)
                except (asyncssh.Error, OSError):
                    pass
                raise

    async def _unpack(
        self, conn: asyncssh.SSHClientConnection, info: _BoxInfo, bundle: Bundle
    ) -> None:
        _, pyz, tree = self._remote(info, bundle)
        args = [shlex.quote(a) for a in (_UNPACK, pyz, tree)]
        cmd = f"{remote_path(self.python)} -c {' '.join(args)}"
        res = await conn.run(sh(cmd), check=False, request_pty=False)
        if res.exit_status != 0:
            raise TransportError(
                f"{self.name}: unpacking the agent on the box failed: "
                f"{str(res.stderr or '').strip()[-800:]}"
            )

    def _agent_command(self, info: _BoxInfo, bundle: Bundle) -> str:
        _, _, tree = self._remote(info, bundle)
        py = remote_path(self.python)
        # The agent's own environment, not only its jobs', gets the python's bin dir first on
        # PATH and the agent's tree on PYTHONPATH: `command` guards (`python -m
        # remote_agent.eagle3 ...`) then resolve on the box as they do locally.
        cmd = (
            f'cd "$HOME" 2>/dev/null; py=$(command -v {py}); '
            'PATH="${py%/*}:$PATH" '
            f'PYTHONPATH={shlex.quote(tree)}"${{PYTHONPATH:+:$PYTHONPATH}}" '
            f"exec {py} {shlex.quote(tree)} serve"
        )
        if self.spool:
            cmd += f" --spool {remote_path(self.spool)}"
        return sh(cmd)

    async def _start_agent(
        self, conn: asyncssh.SSHClientConnection, info: _BoxInfo, bundle: Bundle
    ) -> SshChannel:
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        log = self.state_dir / f"agent-ssh-{re.sub(r'[^A-Za-z0-9_.-]', '_', self.name)}.log"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        session = AgentSession(reader, log)
        await conn.create_session(
            lambda: session,
            self._agent_command(info, bundle),
            encoding=None,
            request_pty=False,  # a PTY would merge stderr and hang the agent up on a drop
        )
        self._session = session
        return SshChannel(session)

    def _check_last_agent(self) -> None:
        """An agent that exited on its own before writing a byte cannot start: say why once,
        instead of retrying forever."""
        s, self._session = self._session, None
        if s is None or not s.closed.is_set() or s.stdout_bytes or s.exit_signal:
            return
        if s.exit_status not in (None, 0):
            raise TransportError(
                f"{self.name}: the agent exited at start with status {s.exit_status}: "
                f"{s.stderr_text() or '(no output)'}",
                permanent=True,
            )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, asyncssh.DisconnectError):
        return f"disconnected: {exc.reason}"
    if isinstance(exc, asyncssh.ChannelOpenError):
        return f"channel refused: {exc.reason}"
    return str(exc) or type(exc).__name__
