"""Rule files, templating, alert state, rule packs, promtool-style rule tests and export."""
