"""Instant-vector algebra for the PromQL engine, all over every evaluation step at once, by job:

* vectors.py: the Vec (one row per label set, a (rows x steps) value matrix and a presence mask),
  label sets, and rows of equal label sets merged (dedupe);
* binary_ops.py: binary operators and vector matching;
* aggregation.py: aggregations;
* histograms.py: histogram_quantile;
* label_functions.py: absent()'s labels and label_replace().

Every function follows Prometheus 2.42's semantics, including which duplicate-label-set situations
are errors and the order in which floats are folded. This module keeps the names imported from it.
"""

from __future__ import annotations

from vllm_sentinel.agent.promql.aggregation import _extreme, _sequential  # noqa: F401  (tests compare the two)
from vllm_sentinel.agent.promql.vectors import drop_name, labels_key  # noqa: F401
