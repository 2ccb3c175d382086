"""Command lines read from /proc: long options as a dict, for vLLM (`vllm serve`, api_server) and other tools (nsys).

One parser serves both the process collector and the live configuration, so a switch is read
the same way everywhere: `--flag` and `--no-flag` of vLLM's boolean options take no value,
`--a=b` and `--a b` are both understood, `--max_num_seqs` is vLLM's spelling of
`--max-num-seqs`, and a flag followed by another flag (or nothing) is a switch.
"""

from __future__ import annotations

# vLLM's boolean flags are argparse BooleanOptionalAction: `--flag` / `--no-flag`, no value follows
VLLM_SWITCHES = frozenset({
    "--enable-chunked-prefill", "--enable-prefix-caching", "--enforce-eager", "--trust-remote-code",
    "--disable-log-stats", "--disable-log-requests", "--enable-log-requests", "--disable-frontend-multiprocessing",
    "--disable-sliding-window", "--disable-custom-all-reduce", "--async-scheduling", "--headless",
    "--enable-expert-parallel", "--enable-lora", "--enable-sleep-mode", "--disable-hybrid-kv-cache-manager",
    "--kv-sharing-fast-prefill", "--enable-prompt-tokens-details", "--enable-auto-tool-choice",
    "--disable-fastapi-docs", "--enable-server-load-tracking", "--enable-force-include-usage",
})
VLLM_SHORT = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size",
              "-q": "--quantization"}


def parse_flags(argv: list[str], switches: frozenset[str] | set[str] = frozenset(),
                short: dict[str, str] | None = None, switch_value: str = "") -> dict[str, str]:
    """Long options of a command line: ['--max-num-seqs', '8', '--enforce-eager'] -> {'--max-num-seqs': '8', '--enforce-eager': ''}.

    A flag in `switches`, or one followed by another flag or by nothing, is a switch and gets
    `switch_value`; `--no-X` of a known switch X gets 'false'. Names in `short` are renamed first.
    Positional arguments are skipped.
    """
    short = short or {}
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = short.get(argv[i], argv[i])
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            if name.startswith("--no-") and "--" + name[5:] in switches:
                flags["--" + name[5:]] = "false"
            elif eq:
                flags[name] = value
            elif name in switches or i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                flags[name] = switch_value
            else:
                flags[name] = argv[i + 1]
                i += 1
        i += 1
    return flags


def parse_vllm_argv(argv: list[str]) -> dict[str, str]:
    """The long options of a vLLM command line, names normalised, switches as 'true'/'false'.

    ['python', '-m', 'vllm.entrypoints.openai.api_server', '--model=/m', '--max_num_seqs', '8',
     '--no-enable-prefix-caching', '-tp', '2'] -> {'--model': '/m', '--max-num-seqs': '8',
     '--enable-prefix-caching': 'false', '--tensor-parallel-size': '2'};
    ['vllm', 'serve', '/m', '--enable-chunked-prefill'] -> {'--model': '/m', '--enable-chunked-prefill': 'true'}
    """
    normalised = []
    for arg in argv:
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            arg = "--" + name[2:].replace("_", "-") + eq + value  # vLLM accepts --max_num_seqs too
        normalised.append(arg)
    flags = parse_flags(normalised, VLLM_SWITCHES, VLLM_SHORT, switch_value="true")
    model = _serve_model(normalised)
    if model is not None:
        flags.setdefault("--model", model)
    return flags


def _serve_model(argv: list[str]) -> str | None:
    """The positional MODEL of `vllm serve [switches] MODEL ...`, or None."""
    try:
        i = argv.index("serve") + 1
    except ValueError:
        return None
    while i < len(argv):
        arg = VLLM_SHORT.get(argv[i], argv[i])
        if not arg.startswith("-"):
            return arg
        # skip an option's value: `--port 9 MODEL` is legal argparse, `--enforce-eager MODEL` is a switch
        takes_value = arg.startswith("--") and "=" not in arg and arg not in VLLM_SWITCHES and not arg.startswith("--no-")
        i += 2 if takes_value else 1
    return None
