"""Incidents with evidence and fixes: live configuration, vLLM defaults, KV arithmetic, diagnose."""
