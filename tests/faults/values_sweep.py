"""The injection sweep's forms and hostile values (tests/faults/test_values_sweep.py runs them).

A *form* is one runbook step that hands a variable `x` to a command: a shell or argv `run:`
shape (interpreters with every option shape, wrappers, stdin shells, builtins, programs that
run a command from an argument) with `x` either inferred (a word type, from the default `v1`)
or declared `type: text`; a dangerous environment name set from `x`; or text passed the one
way it may go (env) to a program that reads it as data. Each hostile value tries to create the
trial's canary file `{c}`. Plain data, no import of the code under test, so the same forms can
be measured against another checkout (the "before" tally in docs/SAFETY.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# ---------------------------------------------------------------- hostile values
HOSTILE = [
    "$(touch {c})",
    "`touch {c}`",
    ";touch {c}",
    "\ntouch {c}\n",
    "a' ; touch {c} #",
    'a" ; touch {c} #',
    '\');__import__("os").system("touch {c}");(\'',
    "__import__('os').system('touch {c}')",
    '";system("touch {c}");"',
    'system("touch {c}")',
    "require('child_process').execSync('touch {c}')",
    "-oProxyCommand=touch {c}",
    "--checkpoint-action=exec=touch {c}",
    "!touch {c}",
    "a[$(touch {c})]",
    "x$(IFS=_;c=touch_{c};$c)",
    "{c}*",
    "{{touch,{c}}}",
    "1e touch {c}",
    "s/^/touch {c}/e",
    ".shell touch {c}",
    'BEGIN{{system("touch {c}")}}',
    "$[$(touch {c})]",
    "|touch {c}",
    "&touch {c}&",
    "${{IFS}}touch${{IFS}}{c}",
]

# ---------------------------------------------------------------- command shapes (`${x}`)
_INTERP_CODE = {  # how each interpreter's code quotes the value
    "py": "print('${x}')",
    "pl": "print '${x}'",
    "js": "console.log('${x}')",
    "rb": "puts '${x}'",
}
_PYTHON = [
    'python3 -c "{py}"',
    'python3 -X dev -c "{py}"',
    'python3 -Xcpu_count=1 -c "{py}"',
    'python3 -X importtime -c "{py}"',
    'python3 -W ignore -c "{py}"',
    'python3 -Wignore::DeprecationWarning -c "{py}"',
    'python3 -I -c "{py}"',
    'python3 -Ic "{py}"',
    'python3 -u -B -c "{py}"',
    'python3 -Bc "{py}"',
    'python3 -E -s -c "{py}"',
    'python3 -m timeit -n 1 "{py}"',
    'python3 -m timeit -n 1 -s "{py}" pass',
    "python3 - <<EOF\n{py}\nEOF",
    "python3 <<EOF\n{py}\nEOF",
    "python3 /dev/stdin <<EOF\n{py}\nEOF",
    'echo "{py}" | python3',
    'python3 <<< "{py}"',
    'python3 <(echo "{py}")',
    "python3 -c \"exec('''{py}''')\"",
]
_PERL = [
    'perl -e "{pl}"',
    'perl -Mstrict -e "{pl}"',
    'perl -MPOSIX -e "{pl}"',
    'perl -Mwarnings=all -e "{pl}"',
    'perl -le "{pl}"',
    'perl -E "{pl}"',
    'perl -w -e "{pl}"',
    'perl -I/tmp -e "{pl}"',
    'echo | perl -ne "{pl}"',
    "perl <<EOF\n{pl}\nEOF",
]
_NODE = [
    'node -e "{js}"',
    'node --eval="{js}"',
    'node --eval "{js}"',
    'node -p "{js}"',
    'node --print="{js}"',
    'node --input-type=commonjs -e "{js}"',
    'node --no-warnings -e "{js}"',
    'echo "{js}" | node',
]
_RUBY = ['ruby -e "{rb}"', 'ruby -w -e "{rb}"', 'ruby -rjson -e "{rb}"']
_SHELLS = [
    'sh -c "echo ${x}"',
    "sh -c ${x}",
    'bash -c "echo ${x}"',
    'dash -c "echo ${x}"',
    'sh -xc "echo ${x}" 2>/dev/null',
    'bash -o pipefail -c "echo ${x}"',
    'bash --norc -c "echo ${x}"',
    'bash -e -u -c "echo ${x}"',
    "sh -s <<EOF\necho ${x}\nEOF",
    "bash /dev/stdin <<EOF\necho ${x}\nEOF",
    'sh /dev/stdin <<< "echo ${x}"',
    'bash <(echo "echo ${x}")',
    'echo "echo ${x}" | sh',
    "printf '%s\\n' \"echo ${x}\" | bash -s",
    'sh <<< "echo ${x}"',
    "cat <<EOF | sh\necho ${x}\nEOF",
    '. /dev/stdin <<< "echo ${x}"',
    'source <(echo "echo ${x}")',
]
_EVAL = [
    'eval "echo ${x}"',
    "eval echo ${x}",
    'case a in a) eval "echo ${x}";; esac',
    "case a in *) eval echo ${x} ;; esac",
    "if true; then eval echo ${x}; fi",
    'trap "echo ${x}" EXIT',
    "trap 'true' 0; trap \"echo ${x}\" 0",
    '$(echo sh) -c "echo ${x}"',
    'c=sh; $c -c "echo ${x}"',
    '"$${SHELL:-sh}" -c "echo ${x}"',
    'command sh -c "echo ${x}"',
    'builtin eval "echo ${x}"',
    'exec sh -c "echo ${x}"',
    'f() { sh -c "$1"; }; f "echo ${x}"',
    'v="echo ${x}"; sh -c "$v"',
]
_WRAPPERS = ["env", "env -u HOME", "nice", "nice -n 5", "timeout 5", "timeout -s KILL 5",
             "nohup", "stdbuf -o0", "setsid -w", "xargs -0 -r", "w", "w -q --", "flock /tmp/sweep.lock"]  # fmt: skip
_WRAPPED = [
    'sh -c "echo ${x}"',
    'bash -o errexit -c "echo ${x}"',
    "python3 -X dev -c \"print('${x}')\"",
    "perl -Mstrict -e \"print '${x}'\"",
    "node --eval=\"console.log('${x}')\"",
]
_BASH_BUILTINS = [
    "printf -v ${x} %s 1",
    "read -r ${x} <<< 1",
    "declare ${x}=1",
    "declare -n r=${x}; echo $r",
    "test -v ${x}",
    "[ -v ${x} ]",
    'v=${x}; echo "$${!v}"',
    "echo $[ ${x} ]",
    "(( ${x} ))",
    "((\n${x}\n))",
    "let ${x}",
    "export ${x}",
    "unset ${x}",
    "mapfile -t ${x} < /dev/null",
    "[[ -v ${x} ]]",
    "echo $(( ${x} ))",
    "i=${x}; echo $((i))",
    "getopts a ${x} 2>/dev/null",
]
_RUNNERS = [
    'git -c alias.x="!${x}" x',
    "git -c core.sshCommand=${x} ls-remote ssh://127.0.0.1:1/x 2>/dev/null",
    "GIT_SSH_COMMAND=${x} git ls-remote ssh://127.0.0.1:1/x 2>/dev/null",
    "git -c core.pager=${x} -p log -1 2>/dev/null",
    "scp -o ProxyCommand=${x} /dev/null 127.0.0.1:x 2>/dev/null",
    'ssh -o ProxyCommand="${x}" 127.0.0.1 true 2>/dev/null',
    "ssh ${x} true 2>/dev/null",
    "ssh -o BatchMode=yes 127.0.0.1 ${x} 2>/dev/null",
    'rsync -e "${x}" /dev/null 127.0.0.1:x 2>/dev/null',
    "rsync --rsh=${x} /dev/null 127.0.0.1:x 2>/dev/null",
    "tar -cf /dev/null --checkpoint=1 --checkpoint-action=exec=${x} /etc/hostname",
    "tar -cf /dev/null ${x} /etc/hostname",
    'sqlite3 :memory: ".shell ${x}"',
    'sqlite3 :memory: "${x}"',
    "find /etc/hostname -maxdepth 0 -exec ${x} \\;",
    'find /etc/hostname -maxdepth 0 -exec sh -c "echo ${x}" \\;',
    "find /etc/hostname ${x}",
    'xargs -I{} sh -c "echo {}" <<< "${x}"',
    "echo ${x} | xargs",
    'awk "BEGIN{print \\"${x}\\"}"',
    "awk -v v=${x} 'BEGIN{print v}'",
    'awk -F, "BEGIN{print \\"${x}\\"}"',
    "echo a | awk ${x}",
    'echo a | sed -n "s/a/${x}/p"',
    'echo a | sed "1e ${x}"',
    'echo a | sed -e "s/a/${x}/e"',
    'echo a | sed --expression="s/a/${x}/"',
    "echo a | sed ${x}",
    'flock /tmp/sweep.lock -c "echo ${x}"',
    'flock -n /tmp/sweep.lock -c "echo ${x}"',
    'watch -n 1 -g "echo ${x}" 2>/dev/null',
    "cp ${x} /dev/null 2>/dev/null",
    "ls ${x} 2>/dev/null",
    "echo ${x}",
    'echo "${x}"',
    "cat <<EOF\n${x}\nEOF",
]
_ARGV = [  # list-form run: (the value as, or inside, one argv element)
    ["python3", "-c", "print('${x}')"],
    ["python3", "-X", "dev", "-c", "${x}"],
    ["python3", "-m", "timeit", "-n", "1", "${x}"],
    ["perl", "-MPOSIX", "-e", "${x}"],
    ["node", "--eval=${x}"],
    ["ruby", "-e", "${x}"],
    ["sh", "-c", "${x}"],
    ["bash", "-o", "pipefail", "-c", "echo ${x}"],
    ["env", "sh", "-c", "${x}"],
    ["nice", "-n", "5", "python3", "-c", "${x}"],
    ["timeout", "5", "bash", "-c", "${x}"],
    ["xargs", "-0", "sh", "-c", "${x}"],
    ["nohup", "sh", "-c", "${x}"],
    ["flock", "/tmp/sweep.lock", "-c", "${x}"],
    ["awk", "${x}"],
    ["sed", "-n", "${x}", "/etc/hostname"],
    ["git", "-c", "alias.x=!${x}", "x"],
    ["tar", "-cf", "/dev/null", "--checkpoint=1", "--checkpoint-action=exec=${x}", "/etc/hostname"],
    ["sqlite3", ":memory:", "${x}"],
    ["find", "/etc/hostname", "-maxdepth", "0", "-exec", "sh", "-c", "${x}", ";"],
    ["ssh", "-o", "ProxyCommand=${x}", "127.0.0.1", "true"],
    ["rsync", "-e", "${x}", "/dev/null", "127.0.0.1:x"],
    ["echo", "${x}"],
    ["printf", "%s", "${x}"],
]


def _expand(templates: list[str], table: dict[str, str]) -> list[str]:
    return [t.format(**table) for t in templates]


def shell_shapes() -> list[str]:
    table = _INTERP_CODE
    out = _expand(_PYTHON, table) + _expand(_PERL, table) + _expand(_NODE, table)
    out += _expand(_RUBY, table)
    out += _SHELLS + _EVAL + _BASH_BUILTINS + _RUNNERS
    for w in _WRAPPERS:
        prefix = 'w() { "$@"; }; w' + w[1:] if w.split()[0] == "w" else w
        out += [f"{prefix} {shape}" for shape in _WRAPPED]
    return out


# ---------------------------------------------------------------- dangerous env names
# each: (name, the command that would read it, what the value is: "script" = the path of a
# prepared script, "dir" = a prepared directory, "so"/"js"/"pm" = a file of that kind)
ENV_NAMES = [
    ("BASH_ENV", "bash -c true", "script"),
    ("ENV", "sh -i -c true </dev/null 2>/dev/null", "script"),
    ("PS4", "set -x; true 2>/dev/null", "code"),
    ("PROMPT_COMMAND", "bash -i -c true </dev/null 2>/dev/null", "code"),
    ("SHELLOPTS", "bash -c true", "code"),
    ("BASHOPTS", "bash -c true", "code"),
    ("IFS", "true", "code"),
    ("CDPATH", "cd tmp 2>/dev/null; true", "dir"),
    ("GLOBIGNORE", "true", "code"),
    ("LD_PRELOAD", "true", "script"),
    ("LD_LIBRARY_PATH", "true", "dir"),
    ("LD_AUDIT", "true", "script"),
    ("PYTHONSTARTUP", "python3 -i </dev/null 2>/dev/null", "py"),
    ("PYTHONPATH", "python3 -c pass", "dir"),
    ("PYTHONINSPECT", "python3 -c pass </dev/null 2>/dev/null", "code"),
    ("PERL5OPT", "perl -e 1", "perlopt"),
    ("PERL5LIB", "perl -Mevil -e 1 2>/dev/null", "dir"),
    ("NODE_OPTIONS", "node -e 0", "nodeopt"),
    ("RUBYOPT", "ruby -e 0 2>/dev/null", "code"),
    ("GIT_SSH_COMMAND", "git ls-remote ssh://127.0.0.1:1/x 2>/dev/null", "script"),
    ("GIT_CONFIG_COUNT", "git -c x.y=1 version >/dev/null", "code"),
    ("GIT_EXEC_PATH", "git evil 2>/dev/null", "dir"),
    ("PATH", "evil", "dir"),
    ("EDITOR", "true", "script"),
    ("PAGER", "true", "script"),
]


@dataclass(frozen=True)
class Form:
    """One step shape; `decl` is how `x` is written in `vars:` ("word": `x: v1`, "text":
    `{type: text, value: v1}`); `env_value` names what a dangerous env name gets."""

    kind: str  # "shell", "argv", "env-name", "env-data"
    run: str | list[str]
    decl: str
    env: dict[str, str] = field(default_factory=dict)
    env_value: str = ""

    @property
    def attack(self) -> str:
        return {
            "shell": "value spliced into a shell run: string",
            "argv": "value in a run: argv list",
            "env-name": "dangerous environment name set from a value",
            "env-data": "text value through env to a program reading data",
        }[self.kind]


# text through env, the one way it goes: each writes "$X" byte-exact into {o}
ENV_DATA = [
    "printf '%s' \"$X\" > {o}",
    "cat > {o} <<EOF\n$X\nEOF",
    "sh -c 'printf %s \"$X\"' > {o}",
    "bash -c 'printf %s \"$X\"' > {o}",
    "eval 'printf %s \"$X\"' > {o}",
    "case a in a) eval 'printf %s \"$X\"' ;; esac > {o}",
    "v=$X; printf '%s' \"$v\" > {o}",
    "printf '%s' \"$X\" | cat > {o}",
    'awk \'BEGIN { printf "%s", ENVIRON["X"] }\' > {o}',
    "perl -e 'print $ENV{X}' > {o}",
    "node -e 'process.stdout.write(process.env.X)' > {o}",
    "python3 -c 'import os,sys; sys.stdout.write(os.environ[\"X\"])' > {o}",
    "env sh -c 'printf %s \"$X\"' > {o}",
    "nice -n 5 python3 -X dev -c 'import os,sys; sys.stdout.write(os.environ[\"X\"])' > {o}",
    "timeout 5 perl -Mstrict -e 'print $ENV{X}' > {o}",
    "trap 'printf %s \"$X\" > {o}' EXIT",
    "printf '%s' \"$X\" | xargs -0 printf '%s' > {o}",
]
ENV_DATA_ARGV = [
    ["python3", "-c", "import os,sys; open(sys.argv[1], 'w').write(os.environ['X'])", "{o}"],
    ["sh", "-c", 'printf %s "$X" > "$1"', "sh", "{o}"],
    ["perl", "-e", "open(F, '>', $ARGV[0]); print F $ENV{X}", "{o}"],
    ["node", "-e", "require('fs').writeFileSync(process.argv[1], process.env.X)", "{o}"],
]


def forms() -> list[Form]:
    out: list[Form] = []
    for decl in ("word", "text"):
        out += [Form("shell", s, decl) for s in shell_shapes()]
        out += [Form("argv", a, decl) for a in _ARGV]
    for name, cmd, what in ENV_NAMES:
        for decl in ("word", "text"):
            out.append(Form("env-name", cmd, decl, {name: "${x}"}, what))
    out += [Form("env-data", s, "text", {"X": "${x}"}) for s in ENV_DATA]
    out += [Form("env-data", a, "text", {"X": "${x}"}) for a in ENV_DATA_ARGV]
    return out


def trials(seed: int, per_form: int) -> list[tuple[Form, str]]:
    """Every form with `per_form` hostile values drawn (seeded); a dangerous name's form gets
    the value its kind needs (a prepared script, a directory, ...) and one hostile value."""
    rng = random.Random(seed)
    out = []
    for form in forms():
        if form.kind == "env-name":
            out.append((form, form.env_value))
            if form.decl == "text":
                out.append((form, rng.choice(HOSTILE)))
            continue
        out += [(form, v) for v in rng.sample(HOSTILE, per_form)]
    return out


# what a dangerous name's value is, written into the trial's directory {d} (canary {c})
PREPARED = {
    "script": "{d}/evil.sh",
    "dir": "{d}/evil",
    "py": "{d}/evil/startup.py",
    "code": "$(touch {c})",
    "perlopt": "-Mevil",
    "nodeopt": "--require={d}/evil/evil.js",
}


def prepare(d: str, canary: str) -> None:
    """The files a dangerous name's value points at: each creates the canary when run."""
    import os
    import stat

    os.makedirs(f"{d}/evil/tmp", exist_ok=True)
    script = f"#!/bin/sh\ntouch {canary}\n"
    for path in (f"{d}/evil.sh", f"{d}/evil/evil", f"{d}/evil/git-evil"):
        with open(path, "w") as f:
            f.write(script)
        os.chmod(path, stat.S_IRWXU)
    py = f"open({canary!r}, 'w').close()\n"
    for name in ("sitecustomize.py", "usercustomize.py", "startup.py"):
        with open(f"{d}/evil/{name}", "w") as f:
            f.write(py)
    with open(f"{d}/evil/evil.pm", "w") as f:
        f.write(f"open(my $f, '>', {canary!r}); 1;\n")
    with open(f"{d}/evil/evil.js", "w") as f:
        f.write(f"require('fs').writeFileSync({canary!r}, '')\n")
