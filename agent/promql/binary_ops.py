"""Binary operators between instant vectors and scalars: arithmetic, comparisons, set operators, vector matching.

Every function follows Prometheus 2.42's semantics, including which duplicate-label-set situations are errors.
"""

from __future__ import annotations

import numpy as np
import promql_parser as pp

from vllm_sentinel.agent.promql import functions as fn
from vllm_sentinel.agent.promql.keymemo import MEMO
from vllm_sentinel.agent.promql.parser import PromQLError
from vllm_sentinel.agent.promql.vectors import Labels, Vec, dedupe, drop_name, drop_names, labels_key

ARITH = {"+", "-", "*", "/", "%", "^", "atan2"}
COMPARISON = {"==", "!=", ">", "<", ">=", "<="}
SET_OPS = {"and", "or", "unless"}


def elem_binop(op: str, lv: np.ndarray, rv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Value and keep-mask of `lv op rv`, as Prometheus' vectorElemBinop (comparisons keep lhs)."""
    with np.errstate(all="ignore"):
        if op == "+":
            return lv + rv, np.ones(lv.shape, bool)
        if op == "-":
            return lv - rv, np.ones(lv.shape, bool)
        if op == "*":
            return lv * rv, np.ones(lv.shape, bool)
        if op == "/":
            return lv / rv, np.ones(lv.shape, bool)
        if op == "%":
            return fn.go_mod(lv, rv), np.ones(lv.shape, bool)
        if op == "^":
            return fn.go_pow(lv, rv), np.ones(lv.shape, bool)
        if op == "atan2":
            return np.arctan2(lv, rv), np.ones(lv.shape, bool)
        cmp = {"==": np.equal, "!=": np.not_equal, ">": np.greater, "<": np.less,
               ">=": np.greater_equal, "<=": np.less_equal}[op]
        return lv, cmp(lv, rv)


def vector_scalar(op: str, vec: Vec, s: np.ndarray, swap: bool, return_bool: bool) -> Vec:
    """`vec op s` (or `s op vec` when swap): arithmetic, or a comparison that filters (or gives 0/1 with bool)."""
    if op in SET_OPS:
        raise PromQLError(f"set operator {op} not allowed between a vector and a scalar")
    lv, rv = (s[None, :], vec.v) if swap else (vec.v, s[None, :])
    value, keep = elem_binop(op, np.broadcast_to(lv, vec.v.shape), np.broadcast_to(rv, vec.v.shape))
    if op in COMPARISON and swap:
        value = vec.v  # the vector element is kept even when it is the right operand
    ok = vec.ok.copy()
    if return_bool:
        value = keep.astype(np.float64)
    else:
        ok &= keep
    keys = vec.keys
    if op in ARITH or return_bool:
        keys = drop_names(keys)
    return dedupe(Vec(keys, np.array(value, dtype=np.float64), ok), whole_series=False)


def _signatures(keys, on: bool, names: list[str]) -> tuple[tuple, ...]:
    """_signature of every key, remembered for a key tuple."""
    return MEMO.get(keys, ("signature", on, tuple(names)), lambda: tuple(_signature(k, on, names) for k in keys))


def _signature(key: Labels, on: bool, names: list[str]) -> tuple:
    if on:
        d = dict(key)
        return tuple((n, d.get(n, "")) for n in sorted(set(names)) if d.get(n, ""))
    drop = set(names) | {"__name__"}
    return tuple(kv for kv in key if kv[0] not in drop)


def set_op(op: str, lhs: Vec, rhs: Vec, on: bool, names: list[str]) -> Vec:
    """`lhs and|or|unless rhs`, matching series on their signature (on/ignoring `names`)."""
    n = lhs.v.shape[1]

    def presence(vec: Vec) -> dict[tuple, np.ndarray]:
        out: dict[tuple, np.ndarray] = {}
        for i, sig in enumerate(_signatures(vec.keys, on, names)):
            out[sig] = out[sig] | vec.ok[i] if sig in out else vec.ok[i].copy()
        return out

    none = np.zeros(n, dtype=bool)
    if op in ("and", "unless"):
        right = presence(rhs)
        ok = lhs.ok.copy()
        for i, sig in enumerate(_signatures(lhs.keys, on, names)):
            there = right.get(sig, none)
            ok[i] &= there if op == "and" else ~there
        return Vec(lhs.keys, lhs.v.copy(), ok)
    left = presence(lhs)
    r_ok = rhs.ok.copy()
    for j, sig in enumerate(_signatures(rhs.keys, on, names)):
        r_ok[j] &= ~left.get(sig, none)
    return dedupe(Vec(list(lhs.keys) + list(rhs.keys), np.vstack([lhs.v, rhs.v]),
                        np.vstack([lhs.ok, r_ok])), whole_series=False)


def _result_labels(lkey: Labels, rkey: Labels, op: str, one_to_one: bool, on: bool, names: list[str],
                   include: list[str]) -> Labels:
    d = dict(lkey)
    if op in ARITH:
        d.pop("__name__", None)
    if one_to_one:
        if on:
            d = {k: v for k, v in d.items() if k in names}
        else:
            for nm in names:
                d.pop(nm, None)
    r = dict(rkey)
    for ln in include:
        if r.get(ln, ""):
            d[ln] = r[ln]
        else:
            d.pop(ln, None)
    return labels_key(d)


def vector_binop(op: str, lhs: Vec, rhs: Vec, card, on: bool, names: list[str], include: list[str],
                  return_bool: bool) -> Vec:
    """`lhs op rhs` between two vectors: one-to-one, or many-to-one/one-to-many with group_left/right."""
    n = lhs.v.shape[1]
    one_to_many = card == pp.VectorMatchCardinality.OneToMany
    one_to_one = card == pp.VectorMatchCardinality.OneToOne
    many, one = (rhs, lhs) if one_to_many else (lhs, rhs)
    if not len(many.keys) or not len(one.keys):
        return Vec.empty(n)
    one_groups: dict[tuple, list[int]] = {}
    for j, sig in enumerate(_signatures(one.keys, on, names)):
        one_groups.setdefault(sig, []).append(j)
    any_many = many.ok.any(axis=0)
    for sig, rows in one_groups.items():
        if len(rows) > 1 and ((one.ok[rows].sum(axis=0) > 1) & any_many).any():
            side = "left" if one_to_many else "right"
            raise PromQLError(f"found duplicate series for the match group {dict(sig)} on the {side} hand-side "
                              "of the operation; many-to-many matching not allowed: matching labels must be "
                              "unique on one side")
    keys, vs, oks, sigs = [], [], [], []
    for i, (k, sig) in enumerate(zip(many.keys, _signatures(many.keys, on, names))):
        for j in one_groups.get(sig, ()):
            m = many.ok[i] & one.ok[j]
            if not m.any():
                continue
            vl, vr = (one.v[j], many.v[i]) if one_to_many else (many.v[i], one.v[j])
            value, keep = elem_binop(op, vl, vr)
            if return_bool:
                value, ok = keep.astype(np.float64), m
            else:
                ok = m & keep
            key = _result_labels(k, one.keys[j], op, one_to_one, on, names, include)
            if return_bool:
                key = drop_name(key)
            keys.append(key)
            vs.append(np.asarray(value, dtype=np.float64))
            oks.append(ok)
            sigs.append(sig)
    if not keys:
        return Vec.empty(n)
    ok_arr = np.array(oks, dtype=bool)
    # Prometheus refuses a match group that yields two results at one step
    per_group: dict[tuple, list[int]] = {}
    for r, (sig, key) in enumerate(zip(sigs, keys)):
        per_group.setdefault((sig,) if one_to_one else (sig, key), []).append(r)
    for rows in per_group.values():
        if len(rows) > 1 and (ok_arr[rows].sum(axis=0) > 1).any():
            if one_to_one:
                raise PromQLError("multiple matches for labels: many-to-one matching must be explicit "
                                  "(group_left/group_right)")
            raise PromQLError("multiple matches for labels: grouping labels must ensure unique matches")
    return dedupe(Vec(keys, np.array(vs), ok_arr), whole_series=False)
