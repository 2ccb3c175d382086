"""vllm-sentinel: records vLLM metrics, GPU counters and stacks on one timeline and labels incidents."""

__version__ = "0.1.0"
