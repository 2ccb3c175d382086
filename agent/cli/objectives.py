"""The latency objectives a command judges by: --ttft-p95 / --tpot-p95 as given, else the rule pack's parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.alerts.ruleparams import load_params_file
from vllm_sentinel.agent.cli.common import Exit, duration_ms, fail

TtftOption = typer.Option(None, "--ttft-p95", help="TTFT p95 objective, e.g. 2s (default: the rules' ttft_slo_seconds)")
TpotOption = typer.Option(None, "--tpot-p95", help="TPOT (inter-token latency) p95 objective, e.g. 100ms "
                          "(default: the rules' tpot_slo_seconds)")


def pack_values(rules: Optional[list[Path]], params: Optional[Path]) -> tuple[dict[str, Any], str]:
    """Every parameter of the rule pack (with --params applied), and where they come from in words."""
    try:
        overrides = load_params_file(params) if params else None
        pack = load_pack(rules, overrides)
    except (RuleFileError, OSError) as e:
        raise fail(str(e)) from None
    return {k: v for f in pack for k, v in f.params.items()}, f"rule params{f' with {overrides.source}' if overrides else ''}"


def objectives(ttft: Optional[str], tpot: Optional[str], values: dict[str, Any], where: str) -> tuple[float, float, str]:
    """(TTFT p95 s, TPOT p95 s, where each came from); a bad or missing one exits 2."""
    slo = []
    for flag, given, name in (("--ttft-p95", ttft, "ttft_slo_seconds"), ("--tpot-p95", tpot, "tpot_slo_seconds")):
        if given is not None:
            seconds = duration_ms(given, flag) / 1000
        elif name in values:
            seconds = float(values[name])
        else:
            raise fail(f"no {flag} and no {name} in the rule params: give {flag}", Exit.USAGE)
        if seconds <= 0:
            raise fail(f"{flag} {given}: an objective must be above zero, e.g. {flag} 2s", Exit.USAGE)
        slo.append(seconds)
    source = ", ".join(f"{'TTFT' if i == 0 else 'TPOT'} from {flag if g is not None else where}"
                       for i, (flag, g) in enumerate((("--ttft-p95", ttft), ("--tpot-p95", tpot))))
    return slo[0], slo[1], source
