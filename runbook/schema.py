"""The runbook schema (pydantic v2). Unknown keys are rejected everywhere.

These models hold *interpolated* values (see interpolate.py); sizes and durations are already
converted to bytes and seconds. Checks are a discriminated union on `check`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from remote_agent.wire.check_vocabulary import RUNBOOK_CHECKS
from remote_agent.wire.targets import glob_refusal
from runbook.units import parse_duration, parse_size

Size = Annotated[int, BeforeValidator(parse_size)]
Duration = Annotated[float, BeforeValidator(parse_duration)]
STEP_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # names a fan-out child step


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Command = str | list[str]  # shell string (values already quoted) or argv


def delete_path_refusal(path: str) -> str | None:
    """Why a `delete:` path is refused before anything runs (the agent applies the same rules
    and the rest on the box: remote_agent/wire/targets.py)."""
    if not path.strip():
        return "a delete path is empty (an unset variable?)"
    if ".." in path.split("/"):
        return "a delete path may not contain `..`: write the path it means"
    return glob_refusal(path)


def _delete_path(path: str) -> str:
    why = delete_path_refusal(path)
    if why:
        raise ValueError(f"{path!r}: {why}")
    return path


def _nonempty_command(v: Any) -> Any:
    if isinstance(v, str) and not v.strip():
        raise ValueError("empty command")
    if isinstance(v, list) and not v:
        raise ValueError("empty argv list")
    return v


# ---------------------------------------------------------------- checks (guards)
class _Check(_Strict):
    title: str | None = None  # optional human label shown next to the observed value

    def probe(self) -> dict[str, Any]:
        """The dict the agent's `probe` op takes (sizes in bytes, durations in seconds)."""
        return self.model_dump(exclude={"title"})


class PathExists(_Check):
    check: Literal["path_exists"]
    path: str


class PathAbsent(_Check):
    check: Literal["path_absent"]
    path: str


class Sha256(_Check):
    check: Literal["sha256"]
    path: str
    any_of: list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = Field(min_length=1)


class DiskFree(_Check):
    check: Literal["disk_free"]
    path: str
    min: Size

    def probe(self) -> dict[str, Any]:
        return {"check": self.check, "path": self.path, "min_bytes": self.min}


class DirSize(_Check):
    check: Literal["dir_size"]
    path: str
    min: Size | None = None
    max: Size | None = None

    @model_validator(mode="after")
    def _bound(self) -> DirSize:
        if self.min is None and self.max is None:
            raise ValueError("dir_size needs min, max or both")
        return self

    def probe(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "path": self.path,
            "min_bytes": self.min,
            "max_bytes": self.max,
        }


class JsonlRecords(_Check):
    check: Literal["jsonl_records"]
    path: str
    count: int | None = None
    min: int | None = None
    max: int | None = None
    field: str | None = None  # sum the lengths of this list field...
    field_len_sum: int | None = None  # ...and require this total

    @model_validator(mode="after")
    def _bound(self) -> JsonlRecords:
        if (
            self.count is None
            and self.min is None
            and self.max is None
            and self.field_len_sum is None
        ):
            raise ValueError("jsonl_records needs count, min, max or field_len_sum")
        if (self.field is None) != (self.field_len_sum is None):
            raise ValueError("give field and field_len_sum together")
        return self


class Manifest(_Check):
    check: Literal["manifest"]
    path: str
    expect: dict[str, Any] = Field(default_factory=dict)
    file_key: str = "file"
    sha_key: str = "sha256"


class StepSucceeded(_Check):
    """Engine-side: the step succeeded in this run, or in an earlier run within `within`."""

    check: Literal["step_succeeded"]
    step: str
    within: Duration | None = None


class CommandCheck(_Check):
    check: Literal["command"]
    run: Annotated[Command, BeforeValidator(_nonempty_command)]
    # filled by the loader: `run` with its values as "${EAGLE_V_x}" references (in run_env)
    run_exec: str | None = None
    run_env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    timeout: Duration = 60.0
    stdout_regex: str | None = None

    @field_validator("stdout_regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"invalid regular expression: {exc}") from None
        return v

    def probe(self) -> dict[str, Any]:
        return {
            "check": "command",
            "argv": self.run if isinstance(self.run, list) else None,
            "shell": (self.run_exec or self.run) if isinstance(self.run, str) else None,
            "cwd": self.cwd,
            "env": {**self.env, **self.run_env},
            "timeout_s": self.timeout,
            "stdout_regex": self.stdout_regex,
        }


class HttpOk(_Check):
    check: Literal["http_ok"]
    url: Annotated[str, Field(pattern=r"^https?://")]
    status: int = 200
    timeout: Duration = 10.0

    def probe(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "url": self.url,
            "status": self.status,
            "timeout_s": self.timeout,
        }


class GpuIdle(_Check):
    check: Literal["gpu_idle"]
    max_memory: Size = 1 << 30
    max_util: int = 10

    def probe(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "max_memory_mib": self.max_memory // (1 << 20),
            "max_util": self.max_util,
        }


Check = Annotated[
    PathExists
    | PathAbsent
    | Sha256
    | DiskFree
    | DirSize
    | JsonlRecords
    | Manifest
    | StepSucceeded
    | CommandCheck
    | HttpOk
    | GpuIdle,
    Field(discriminator="check"),
]
CHECK_TYPES = RUNBOOK_CHECKS  # the one definition: remote_agent/wire/check_vocabulary.py


# ---------------------------------------------------------------- steps
class Retry(_Strict):
    max: int = Field(ge=1, le=100)
    on: list[Literal["lost", "timeout"] | int] = Field(min_length=1)
    backoff: Duration = 10.0  # first delay; doubles each attempt, capped at 10 minutes


class Service(_Strict):
    """A long-lived job (a server): the step succeeds once `ready` holds; the job keeps running
    until a later step with `stop:` (or the operator) ends it."""

    ready: Check
    timeout: Duration = 1800.0  # give up (and stop the job) if not ready by then
    interval: Duration = 5.0
    # a step that `uses:` this service and finds its job dead restarts it, at most this often
    restarts: int = Field(0, ge=0, le=20)


class Step(_Strict):
    id: str
    title: str
    run: Annotated[
        Command | None, BeforeValidator(lambda v: v if v is None else _nonempty_command(v))
    ] = None
    requires: list[str] = Field(default_factory=list)
    preconditions: list[Check] = Field(default_factory=list)
    postconditions: list[Check] = Field(default_factory=list)
    skip_if: list[Check] = Field(default_factory=list)
    destructive: bool = False
    confirm: str | None = None
    # What skipping this step leaves behind on the box (a patched file, a server holding the
    # GPUs): the operator is told before and when it is skipped, and the audit keeps it.
    skipping_leaves: str | None = None
    timeout: Duration | None = None
    retry: Retry | None = None
    # Running it twice is safe (resumable, or it overwrites its own output): only then may a
    # job whose fate is unknown (`lost`) be relaunched without the operator deciding.
    idempotent: bool = False
    detach: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    # names of runbook/env_names.py's list (BASH_ENV, LD_PRELOAD, ...) this step and its command
    # checks set on purpose: without it such a name in `env:` is refused
    allow_env: list[str] = Field(default_factory=list)
    # env var name -> secret name; filled by the loader from `env: {X: ${SECRET}}`
    secret_env: dict[str, str] = Field(default_factory=dict)
    # filled by the loader: the shell `run` that executes, its values as "${EAGLE_V_x}"
    # references (their values in run_env); `run` is the form shown to the operator and audited
    run_exec: str | None = None
    run_env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    host: str | None = None
    # fan-out (runbook/engine/fanout.py): one job per host, `${host}`, `${host_rank}` and
    # `${host_count}` set per host; the loader adds the per-host child steps (`id.host`)
    hosts: list[str] | None = None
    fanout_of: str | None = None  # set by the loader on a child: its fan-out step's id
    host_rank: int | None = None  # set by the loader on a child
    artifacts: list[str] = Field(default_factory=list)  # files hashed into the audit on success
    service: Service | None = None  # a server: succeeds when ready, keeps running
    # service steps this step talks to: a dead one is restarted before each attempt (bounded by
    # its `service.restarts`, audited as service.restarted), so a retry resumes against it
    uses: list[str] = Field(default_factory=list)
    stop: str | None = None  # id of a service step whose job this step stops (no `run:`)
    # the delete action (docs/SAFETY.md "Deletes"): the agent itself removes exactly these
    # paths, each under `delete_within:`, as measured and confirmed; the step has no `run:`
    delete: list[Annotated[str, AfterValidator(_delete_path)]] = Field(default_factory=list)
    delete_within: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _removes_is_gone(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("removes" in data or "removes_within" in data):
            raise ValueError(
                "`removes:`/`removes_within:` are gone: a step deletes with `delete: [paths]` "
                "and `delete_within: root` and no `run:` (the agent deletes exactly what it "
                "measured; docs/RUNBOOKS.md)"
            )
        return data

    @property
    def launches_job(self) -> bool:
        """It runs a job on the box: its `run:`, or the agent's delete."""
        return self.run is not None or bool(self.delete)

    @property
    def shown_command(self) -> Any:
        """What the step runs, as shown and audited: its `run:`, or the delete it asks of the agent."""
        if self.delete:
            return f"delete (by the agent) {' '.join(self.delete)} within {self.delete_within}"
        return self.run

    @field_validator("skip_if", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, dict) else v

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not STEP_ID_RE.match(v):
            raise ValueError(
                "step ids are 1-64 characters: letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not ENV_NAME_RE.match(name):
                raise ValueError(f"invalid environment variable name {name!r}")
        return v

    @model_validator(mode="after")
    def _destructive(self) -> Step:
        if self.destructive and not self.confirm:
            raise ValueError(
                "a destructive step needs `confirm:` (the prompt shown before it runs)"
            )
        if self.delete or self.delete_within:
            if not (self.delete and self.delete_within):
                raise ValueError(
                    "`delete:` (the paths) and `delete_within:` (their root) go together"
                )
            if not self.destructive:
                raise ValueError("a `delete:` step must be `destructive: true` (with `confirm:`)")
            clash = [
                k
                for k, v in (
                    ("run", self.run),
                    ("stop", self.stop),
                    ("service", self.service),
                    ("hosts", self.hosts),
                    ("retry", self.retry),
                    ("timeout", self.timeout),
                    ("cwd", self.cwd),
                )
                if v is not None
            ] + [k for k, v in (("env", self.env), ("detach", self.detach)) if v]
            if clash:
                raise ValueError(
                    f"a `delete:` step is done by the agent itself: remove {', '.join(clash)}"
                )
        if self.run is None and (self.detach or self.retry or self.timeout or self.service):
            raise ValueError("detach, retry, timeout and service need `run:`")
        if self.retry is not None and "lost" in self.retry.on and not self.idempotent:
            raise ValueError(
                "`retry` on `lost` relaunches a job whose fate is unknown (it may have run to "
                "the end): declare `idempotent: true` if running it twice is safe, or drop `lost`"
            )
        if self.hosts is not None:
            if self.host is not None:
                raise ValueError("give `host:` (one box) or `hosts:` (a fan-out), not both")
            if not self.hosts:
                raise ValueError("`hosts:` needs at least one host")
            dup = sorted({h for h in self.hosts if self.hosts.count(h) > 1})
            if dup:
                raise ValueError(f"`hosts:` names {', '.join(dup)} more than once")
            bad = [h for h in self.hosts if not HOST_NAME_RE.match(h)]
            if bad:
                raise ValueError(
                    f"host name {bad[0]!r} cannot name a fan-out job: letters, digits, '.', "
                    "'_', '-' (declare it under `hosts:` at the top and use its name)"
                )
        if self.service is not None and not self.detach:
            raise ValueError("a service must be `detach: true` (it outlives the step)")
        if self.stop is not None and self.run is not None:
            raise ValueError(
                "a `stop:` step stops a service and runs nothing itself; remove `run:`"
            )
        return self


class SecretRef(_Strict):
    env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]  # read from this local env var
    required: bool = True


class HostConfig(_Strict):
    """A named box. Steps and --host may name it; an unnamed `[user@]host[:port]` or ~/.ssh/config
    alias works too (with python3 and the default spool)."""

    ssh: str  # [user@]host[:port] or an alias from ~/.ssh/config
    python: str = "python3"  # e.g. the SGLang/training venv's python: jobs run with its PATH
    spool: str | None = None  # agent spool on the box (default ~/.eagle-tui/spool)
    # this box's values of runbook variables in fan-out steps (e.g. its address, its NIC)
    vars: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("vars")
    @classmethod
    def _var_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if name in ("host", "host_rank", "host_count") or not ENV_NAME_RE.match(name):
                raise ValueError(f"{name!r} cannot be a host variable")
        return v


VarValue = str | int | float | bool


class VarDecl(_Strict):
    """A variable with a declared type: `root: {type: path, value: /srv/x}` (runbook/value_types.py
    says which characters each type holds and where it may go)."""

    type: Literal[
        "path", "name", "integer", "number", "size", "duration", "bool", "enum", "url", "text"
    ]
    value: VarValue
    choices: list[str] | None = None  # the values an enum may take

    @model_validator(mode="after")
    def _choices(self) -> VarDecl:
        from runbook.value_types import refusal

        if (self.type == "enum") != (self.choices is not None):
            raise ValueError("`choices:` goes with `type: enum` (and an enum needs it)")
        for c in self.choices or ():
            why = refusal("path", c)
            if why is not None:
                raise ValueError(f"enum choice {c!r} cannot be a word: {why}")
        return self


class Runbook(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    description: str = ""
    vars: dict[str, VarValue] = Field(default_factory=dict)
    secrets: dict[str, SecretRef] = Field(default_factory=dict)
    host: str | None = (
        None  # default host of every step: "local", a name in `hosts`, or an ssh target
    )
    hosts: dict[str, HostConfig] = Field(default_factory=dict)
    auto_confirm: list[str] = Field(default_factory=list)
    watch: list[str] = Field(default_factory=list)  # paths whose free space the cockpit shows
    steps: list[Step] = Field(min_length=1)

    def step(self, step_id: str) -> Step:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    @property
    def step_ids(self) -> list[str]:
        return [s.id for s in self.steps]
