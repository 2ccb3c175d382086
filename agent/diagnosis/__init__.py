"""Incidents with evidence and fixes: live configuration, vLLM defaults, KV arithmetic, diagnose.

Holds: incidents (live and over a window, over any engine), episodes (episodes.py: co-occurring
incidents of an instance, roots and caused_by), the fix registry and fixes, live configuration (and
inferred from metrics), the autoscaling signal (replica_signal.py), vLLM defaults, KV arithmetic,
stack captures, diagnose (and remote.py: from a Prometheus), health summary, compare (before/after a
change, significance, SLO attainment and goodput compare_slo.py, one verdict procedure, the model's
prediction for the change beside the measurement compare_prediction.py), capacity
(the SLO point, routing.py), whatif (a window's workload read back from counters and histograms
sim_workload.py, a discrete-event model of vLLM V1's scheduler sim_scheduler.py/sim_results.py, its
step time fitted and its replay judged against the window sim_calibrate.py, knobs whatif_knobs.py),
every incident's fixes predicted by that model and ranked by goodput (fix_ranking.py; the memory
levers of KV pressure in fixes_kv_memory.py)

Imports: alerts and below (the layers contract in pyproject.toml; scripts/lint_layers.sh).
"""
