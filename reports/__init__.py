"""Markdown/JSON rendering and charts."""
