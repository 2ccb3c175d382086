"""The sidecar's own Prometheus metrics (vllm_sentinel_*), served on loopback."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class SelfMetrics:
    """Counters and gauges about scraping, storing and incidents, in a registry of their own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.scrape_duration = Gauge("vllm_sentinel_scrape_duration_seconds",
                                     "Duration of the last collection of a target", ["target"], registry=r)
        self.scrapes = Counter("vllm_sentinel_scrapes", "Collections by target and result",
                               ["target", "result"], registry=r)
        self.skipped = Counter("vllm_sentinel_collections_skipped",
                               "Collections skipped because the previous one of that target was still running",
                               ["target"], registry=r)
        # far above the interval means the sidecar itself waits for a CPU (a host vLLM saturates)
        self.collection_gap = Histogram("vllm_sentinel_collection_gap_seconds",
                                        "Time between the starts of two consecutive collections of a target",
                                        ["target"], buckets=(0.5, 1, 1.5, 2, 3, 5, 10, 30, 60, 300), registry=r)
        self.target_up = Gauge("vllm_sentinel_target_up", "1 if the last collection of a target succeeded",
                               ["target"], registry=r)
        self.samples_stored = Counter("vllm_sentinel_samples_stored", "Samples committed to the store", registry=r)
        self.commit_seconds = Histogram("vllm_sentinel_store_commit_seconds", "Time to commit one tick",
                                        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
                                        registry=r)
        self.dropped_batches = Counter("vllm_sentinel_dropped_batches",
                                       "Batches dropped because the store fell behind (queue full)", registry=r)
        self.store_errors = Counter("vllm_sentinel_store_errors", "Failed store commits", registry=r)
        self.store_writable = Gauge("vllm_sentinel_store_writable",
                                    "0 while the store cannot write (disk full): batches are held in memory",
                                    registry=r)
        self.batches_held = Gauge("vllm_sentinel_batches_held",
                                  "Batches held in memory until the store can write again", registry=r)
        self.samples_rejected = Counter("vllm_sentinel_samples_rejected",
                                        "Samples the store refused (time outside 1970..2262, broken labels)",
                                        ["target", "reason"], registry=r)
        self.batches_failed = Counter("vllm_sentinel_batches_failed",
                                      "Batches of a target that failed to commit even alone, and were dropped",
                                      ["target"], registry=r)
        self.target_stored = Gauge("vllm_sentinel_target_stored",
                                   "1 if the last batch of a target was stored whole", ["target"], registry=r)
        self.series = Gauge("vllm_sentinel_series", "Series known to the store", registry=r)
        self.alert_notifications = Counter("vllm_sentinel_alertmanager_notifications",
                                           "Alerts sent to (or failed, or dropped before) an Alertmanager",
                                           ["alertmanager", "result"], registry=r)
        self.incidents_active = Gauge("vllm_sentinel_incidents_active", "Firing incidents",
                                      ["incident", "severity"], registry=r)
        # one series per model: the reason beside the number, so max(...{model_name=...}) reads the need
        self.desired_replicas = Gauge("vllm_sentinel_desired_replicas",
                                      "Replicas of a model its firing incidents ask for (reason queue, kv_pressure, "
                                      "ttft_slo), else the replicas serving it now (reason none)",
                                      ["model_name", "reason"], registry=r)
        self._desired: dict[tuple[str, str], int] = {}

    def set_desired_replicas(self, needs: Mapping[str, object]) -> None:
        """Publish model -> need (anything with .replicas and .reason); a model's old reason series is removed."""
        new = {(model, str(getattr(n, "reason"))): int(getattr(n, "replicas")) for model, n in needs.items()}
        for key in set(self._desired) - set(new):
            self.desired_replicas.remove(*key)
        for key, value in new.items():
            self.desired_replicas.labels(*key).set(value)
        self._desired = new

    def serve(self, port: int, host: str = "127.0.0.1") -> object:
        """Serve /metrics on host:port (loopback by default); returns the server."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
