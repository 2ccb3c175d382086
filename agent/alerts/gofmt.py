"""Values printed as Go's fmt package prints them, for alert templates and promtool-identical messages.

`{{ $value }}` of 1e6 is "1e+06", of 0.5 is "0.5"; `printf` follows fmt.Sprintf's verbs.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from decimal import Decimal
from typing import Any


def go_float(v: float) -> str:
    """Format a float as Go's %v: 0.5 -> '0.5', 1e6 -> '1e+06', 100000.0 -> '100000', nan -> 'NaN'."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    sign, digits, exp = Decimal(repr(float(v))).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    exp += len("".join(map(str, digits))) - len(ds)  # account for stripped zeros
    nd = len(ds)
    dp = nd + exp  # position of the decimal point relative to the digit string
    x = dp - 1
    s = "-" if sign else ""
    if x < -4 or x >= 6:  # Go's shortest %g switches to %e at precision 6, as %v does
        mant = ds[0] + ("." + ds[1:] if nd > 1 else "")
        return f"{s}{mant}e{'-' if x < 0 else '+'}{abs(x):02d}"
    if dp <= 0:
        return f"{s}0.{'0' * -dp}{ds}"
    if dp >= nd:
        return f"{s}{ds}{'0' * (dp - nd)}"
    return f"{s}{ds[:dp]}.{ds[dp:]}"


def go_str(v: Any) -> str:
    """Print a template value as Go's fmt.Fprint would."""
    if v is None:
        return "<no value>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{go_str(v[k])}" for k in sorted(v)) + "]"
    if isinstance(v, (list, tuple)):
        return "[" + " ".join(go_str(x) for x in v) + "]"
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".") + " +0000 UTC"
    return str(v)



_VERB_RE = re.compile(r"%([-+# 0]*)(\d+|\*)?(?:\.(\d+|\*))?([a-zA-Z%])")


def go_sprintf(fmt: str, *args: Any) -> str:
    """Go's fmt.Sprintf for the verbs templates use: %s %v %d %f %e %g %x %q %t %%."""
    out: list[str] = []
    pos = 0
    ai = 0
    for m in _VERB_RE.finditer(fmt):
        out.append(fmt[pos:m.start()])
        pos = m.end()
        flags, width, prec, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        if verb == "%":
            out.append("%")
            continue
        if ai >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        a = args[ai]
        ai += 1
        spec = "%" + flags + (width or "") + (f".{prec}" if prec is not None else "")
        out.append(_format_verb(spec, verb, a, prec))
    out.append(fmt[pos:])
    if ai < len(args):
        out.append("%!(EXTRA " + ", ".join(f"{go_type(a)}={go_str(a)}" for a in args[ai:]) + ")")
    return "".join(out)


def go_type(a: Any) -> str:
    """The Go type name fmt prints for a template value in an error verb (%!d(string=x))."""
    return {bool: "bool", int: "int", float: "float64", str: "string"}.get(type(a), "map[string]string")


def _format_verb(spec: str, verb: str, a: Any, prec: str | None) -> str:
    bad = f"%!{verb}({go_type(a)}={go_str(a)})"
    if verb in "sv":
        return (spec + "s") % go_str(a)
    if verb == "q":
        return '"' + go_str(a).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if verb == "t":
        return go_str(a) if isinstance(a, bool) else bad
    if verb in "dxXob":
        if isinstance(a, bool) or not isinstance(a, int):
            return bad
        return format(a, "b") if verb == "b" else (spec + verb) % a
    if verb in "feEgG":
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            return bad
        v = float(a)
        if math.isnan(v) or math.isinf(v):
            return go_float(v)
        if verb in "gG" and prec is None:
            s = go_float(v)  # Go's %g without precision is the shortest representation
            return s.upper() if verb == "G" else s
        return (spec + verb) % v
    return bad
