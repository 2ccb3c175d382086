"""The `vllm-sentinel` command line: one module per command group over the library."""
