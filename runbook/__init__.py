"""Runbook engine: schema, loader, plan, executor, checks, state and audit. Never imports textual."""
