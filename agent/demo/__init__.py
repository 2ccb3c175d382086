"""The embedded default: a tiny model, a real vLLM CPU server, traffic, scenarios, recordings and replay."""
