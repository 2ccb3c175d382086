"""The sidecar daemon: scrape loop, wiring, local API and its routes, Alertmanager, reports, own metrics."""
