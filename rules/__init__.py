"""Rule files (YAML data) and their promtool-format tests."""
