"""Incidents: firing alerts of the loaded rules, with evidence and fixes, live and over a window.

* `Evaluator` (incidents_live.py) is the sidecar's evaluation hook: called every few seconds with
  the store and a time, it evaluates the rules, and opens, updates and resolves rows of the
  `incidents` table.
* `evaluate_window` (incidents_window.py) evaluates the alerting rules over a past window as a
  range query, then replays Prometheus' alert state machine over the steps, so an incident that
  came and went inside the window is found, `for` and `keep_firing_for` included. It returns
  incident dicts in the `diagnose --format json` contract.

An incident (incident_record.py) starts when its alert fires (Alertmanager's startsAt) and ends
when it resolves. Evidence is read at the incident's peak (incident_evidence.py); fixes are
computed from a configuration snapshot (incident_fixes.py) by the functions of
agent/diagnosis/fixes.py, registered with `register_fix` (unknown names say so). This module
keeps the names imported from it.
"""

from __future__ import annotations

# register_fix is the hook for a site's own fix computations; the 'not registered' message names it here
from vllm_sentinel.agent.diagnosis.fix_registry import register_fix  # noqa: F401
from vllm_sentinel.agent.diagnosis.incident_evidence import evidence_values  # noqa: F401
from vllm_sentinel.agent.diagnosis.incident_fixes import compute_fixes  # noqa: F401
from vllm_sentinel.agent.diagnosis.incident_record import (Incident, duration_s, incident_id,  # noqa: F401
                                                           stored_incidents)
from vllm_sentinel.agent.diagnosis.incident_rules import ConfigFor  # noqa: F401
from vllm_sentinel.agent.diagnosis.incidents_live import Evaluator  # noqa: F401
from vllm_sentinel.agent.diagnosis.incidents_window import (DEFAULT_STEP_MS, evaluate_rules,  # noqa: F401
                                                            evaluate_window, window_evaluator)
