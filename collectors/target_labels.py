"""Labels a target carries onto every series scraped from it (file_sd `labels`), merged as Prometheus does.

A scraped label that clashes with a target label is kept as `exported_<name>` and the target's
value wins (Prometheus' `honor_labels: false`, its default):

    TargetLabels({"job": "vllm"}).apply('job="x",model_name="m"')
      -> 'exported_job="x",job="vllm",model_name="m"'
"""

from __future__ import annotations

from .base import format_labels
from .exposition import parse_labels


class TargetLabels:
    """Merges a target's labels into scraped label text; remembers the texts of the last scrape."""

    def __init__(self, labels: dict[str, str] | None = None) -> None:
        self.labels = {k: v for k, v in (labels or {}).items() if v != ""}  # an empty value is no label
        self.text = format_labels(self.labels)  # what `up` and the scrape_* series carry
        self._merged: dict[str, str] = {}

    def apply(self, label_text: str) -> str:
        """One scraped label text with the target's labels merged in (cached per distinct text)."""
        if not self.labels:
            return label_text
        merged = self._merged.get(label_text)
        if merged is None:
            merged = self._merged[label_text] = self._merge(label_text)
        return merged

    def apply_all(self, label_texts: list[str]) -> list[str]:
        """Every text of one scrape merged; the cache keeps only this scrape's texts (bounded by the series)."""
        if not self.labels:
            return label_texts
        previous, self._merged = self._merged, {}
        out = []
        for text in label_texts:
            merged = self._merged.get(text)
            if merged is None:
                merged = previous.get(text) or self._merge(text)
                self._merged[text] = merged
            out.append(merged)
        return out

    def _merge(self, label_text: str) -> str:
        try:
            scraped = parse_labels(label_text)
        except ValueError:
            return label_text  # the store refuses broken label text and counts it; nothing to merge into
        for name in [n for n in scraped if n in self.labels]:
            exported = f"exported_{name}"
            while exported in scraped or exported in self.labels:
                exported = f"exported_{exported}"
            scraped[exported] = scraped.pop(name)
        return format_labels({**scraped, **self.labels})
