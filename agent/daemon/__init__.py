"""The sidecar daemon: scrape loop, wiring, local API and its routes, Alertmanager, reports, own metrics.

Holds: vllm-sentinel run: scrape loop (sidecar), its clock (schedule.py: each collector on its
cadence, never overlapping itself; an asyncio loop that also runs every target's scrape on its one
thread, the other collectors on a pool of 8), wiring, targets (targets.py, file_sd files in
file_sd.py), the local API server, its routes and client, Alertmanager, auto-reports, own metrics
and /healthz /readyz (ownhttp.py)

Imports: reports and below (the layers contract in pyproject.toml; scripts/lint_layers.sh).
"""
