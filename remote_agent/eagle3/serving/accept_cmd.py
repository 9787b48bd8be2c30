"""`eagle3 accept`: acceptance length measured on a live SGLang server (SGLang's formula)."""

from remote_agent.eagle3.serving.checks import add_accept_arguments as add_arguments
from remote_agent.eagle3.serving.checks import run_accept as run

HELP = "acceptance length of a live SGLang EAGLE-3 server on MT-Bench-style prompts"
__all__ = ["HELP", "add_arguments", "run"]
