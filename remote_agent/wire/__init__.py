"""The wire contracts: what the agent, the engine and the cockpit all import (standard library only).

The protocol's version, errors and log-byte encoding (`protocol.py`), the progress line
(`progress.py`), the atomic write (`atomic_write.py`), secret redaction (`redact.py`), the check
vocabulary (`check_vocabulary.py`) and the delete-path rules (`targets.py`: the runbook's loader
refuses glob paths with them, the agent resolves and measures delete targets with them). Nothing
here imports the agent core (`remote_agent/agent/`) or the payload (`remote_agent/eagle3/`).
"""
