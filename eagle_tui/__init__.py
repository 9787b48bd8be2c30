"""eagle-tui: the operator's cockpit (Textual app and headless CLI) over the runbook engine."""

__version__ = "0.1.0"
