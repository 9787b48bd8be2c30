"""Environment names that a shell, the dynamic loader or an interpreter reads as code, as options,
or as the place to load code from: setting one runs or loads what its value says.

A step's `env:` (and its command checks' `env:`) may set one only when the step lists it under
`allow_env:` (docs/SAFETY.md, Environment names), and even then not from a `text` value. The rule
is the list below plus its prefixes; the names eagle-tui sets itself (EAGLE_V_*, values by
reference) are its own and refused in `env:` anyway.
"""

from __future__ import annotations

_EXACT = frozenset(
    {
        # shells: startup files, prompts and traces that expand code, parsing and lookup
        "BASH_ENV", "ENV", "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "SHELLOPTS",
        "BASHOPTS", "IFS", "CDPATH", "GLOBIGNORE", "BASH_XTRACEFD", "BASH_LOADABLES_PATH",
        "FPATH", "ZDOTDIR", "INPUTRC", "HISTFILE", "POSIXLY_CORRECT", "EXECIGNORE",
        # program lookup and the C library
        "PATH", "GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "HOSTALIASES",
        "RESOLV_HOST_CONF",
        # interpreters that run or import code named here
        "PYTHONSTARTUP", "PYTHONPATH", "PYTHONHOME", "PYTHONINSPECT", "PYTHONUSERBASE",
        "PYTHONBREAKPOINT", "PYTHONWARNINGS", "PYTHONPLATLIBDIR", "PYTHONEXECUTABLE",
        "NODE_OPTIONS", "NODE_PATH", "NODE_REPL_EXTERNAL_MODULE", "RUBYOPT", "RUBYLIB",
        "LUA_INIT", "LUA_PATH", "LUA_CPATH", "TCLLIBPATH", "AWKPATH", "AWKLIBPATH",
        "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "R_PROFILE",
        "R_PROFILE_USER", "R_ENVIRON", "R_ENVIRON_USER", "PHPRC", "PHP_INI_SCAN_DIR",
        # programs that run a command named here
        "GIT_SSH", "GIT_SSH_COMMAND", "GIT_EXEC_PATH", "GIT_ASKPASS", "GIT_EDITOR",
        "GIT_PAGER", "GIT_PROXY_COMMAND", "GIT_EXTERNAL_DIFF", "GIT_TEMPLATE_DIR",
        "GIT_DIR", "GIT_WORK_TREE", "GIT_CEILING_DIRECTORIES", "RSYNC_RSH", "RSYNC_CONNECT_PROG",
        "SSH_ASKPASS", "SUDO_ASKPASS", "EDITOR", "VISUAL", "PAGER", "MANPAGER", "LESSOPEN",
        "LESSCLOSE", "BROWSER", "TAR_OPTIONS", "GZIP", "XZ_OPT", "ZSTD_CLEVEL", "SHELL",
        "HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "OPENSSL_CONF", "OPENSSL_ENGINES",
        "SSLKEYLOGFILE", "CURL_HOME", "WGETRC", "PIP_CONFIG_FILE", "MAKEFLAGS", "MAKEFILES",
        "SQLITE_HISTORY", "SYSTEMD_PAGER",
    }
)  # fmt: skip
# whole families: the dynamic loader (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...), exported bash
# functions, git's config-from-environment, Perl's options and library paths
_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_", "GIT_CONFIG", "PERL", "PYTHONSTARTUP")


def dangerous(name: str) -> bool:
    return name in _EXACT or name.startswith(_PREFIXES)


def why(name: str) -> str:
    return (
        f"{name} is read by a shell, the dynamic loader or an interpreter as code or as where "
        "to load code from; if this step sets it on purpose, list it under the step's "
        f"`allow_env: [{name}]`"
    )
