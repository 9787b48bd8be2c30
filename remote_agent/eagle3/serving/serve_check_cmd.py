"""`eagle3 serve-check`: the live SGLang server runs EAGLE-3 with the expected drafter."""

from remote_agent.eagle3.serving.checks import add_serve_check_arguments as add_arguments
from remote_agent.eagle3.serving.checks import run_serve_check as run

HELP = "check that a live SGLang server runs EAGLE3 with the expected drafter and settings"
__all__ = ["HELP", "add_arguments", "run"]
