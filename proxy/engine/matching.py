"""Vector matching of PromQL's binary operators, as promql/engine.go of v2.42 does it: the
element operations (vectorElemBinop, scalarBinop), the matching signature (signatureFunc),
the output labels (resultMetric), and VectorBinop at one step (`binop_step`), the line-by-line
reference binop.py's vectorised join replays a doubtful step with.

    Matching.of(node)                       the cardinality, on/ignoring labels, group_x include
    result_metric(many, one, op, m, bool)   the label set of one output sample
    binop_step(op, bool, m, lhs, rhs)       one step's output, or Prometheus's error
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from proxy.engine.errors import DuplicateLabelset, EvalError
from proxy.result.golang import go_atan2, go_pow, go_quote
from shardplanner.ast import COMPARISON_OPS, SET_OPS, Binary

__all__ = ["DROP_NAME", "Matching", "Sample", "apply_op", "binop_step", "elem_op", "label_key", "labels_string",
           "result_metric", "scalar_values"]

F64 = npt.NDArray[np.float64]
Labels = dict[str, str]
Key = tuple[tuple[str, str], ...]

# shouldDropMetricName: atan2 is not in Prometheus's list, so `a atan2 b` keeps __name__.
DROP_NAME = frozenset({"+", "-", "*", "/", "%", "^"})

ONE_TO_ONE_DUP = "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
GROUP_DUP = "multiple matches for labels: grouping labels must ensure unique matches"


# --------------------------------------------------------------------------------------
# Element operations (vectorElemBinop, scalarBinop)
# --------------------------------------------------------------------------------------


def apply_op(op: str, a: F64, b: F64) -> tuple[F64, npt.NDArray[np.bool_]]:
    """vectorElemBinop over arrays: (value, keep). Comparisons return `a` and the test."""
    with np.errstate(all="ignore"):
        if op in COMPARISON_OPS:
            keep = {
                "==": np.equal, "!=": np.not_equal, ">": np.greater,
                "<": np.less, ">=": np.greater_equal, "<=": np.less_equal,
            }[op](a, b)
            return np.asarray(a, dtype=np.float64), np.asarray(keep, dtype=bool)
        if op == "+":
            v = a + b
        elif op == "-":
            v = a - b
        elif op == "*":
            v = a * b
        elif op == "/":
            v = a / b
        elif op == "%":
            v = np.fmod(a, b)
        elif op == "^":
            v = go_pow(a, b).reshape(np.shape(a + b))
        elif op == "atan2":
            v = go_atan2(a, b)
        else:
            raise EvalError(f"operator {op!r} not allowed for operations between vectors")
    v = np.asarray(v, dtype=np.float64)
    return v, np.ones(v.shape, dtype=bool)


def scalar_values(op: str, a: F64, b: F64) -> F64:
    """scalarBinop: comparisons give 0/1."""
    v, keep = apply_op(op, a, b)
    if op in COMPARISON_OPS:
        return keep.astype(np.float64)
    return v


def elem_op(op: str, a: float, b: float) -> tuple[float, bool]:
    v, k = apply_op(op, np.array([a]), np.array([b]))
    return float(v[0]), bool(k[0])


# --------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------


def label_key(labels: Labels) -> Key:
    return tuple(sorted(labels.items()))


def labels_string(labels: Labels | Key) -> str:
    """labels.Labels.String(): `{a="1", b="2"}`."""
    items = labels if isinstance(labels, tuple) else label_key(labels)
    return "{" + ", ".join(f"{k}={go_quote(v)}" for k, v in sorted(items)) + "}"


@dataclass(frozen=True)
class Matching:
    card: Literal["one-to-one", "many-to-one", "one-to-many", "many-to-many"]
    on: bool
    labels: tuple[str, ...]
    include: tuple[str, ...]

    @classmethod
    def of(cls, node: Binary) -> Matching:
        vm = node.matching
        if node.op in SET_OPS:
            card: Literal["one-to-one", "many-to-one", "one-to-many", "many-to-many"] = "many-to-many"
        elif vm is not None and vm.group == "left":
            card = "many-to-one"
        elif vm is not None and vm.group == "right":
            card = "one-to-many"
        else:
            card = "one-to-one"
        if vm is None:
            return cls(card, False, (), ())
        return cls(card, vm.on, tuple(vm.labels), tuple(vm.include) if vm.group else ())

    def signature(self, labels: Labels) -> Key:
        """signatureFunc: on(l) -> the present labels of l; ignoring(l) -> the others but
        __name__."""
        if self.on:
            names = set(self.labels)
            return tuple(sorted((k, v) for k, v in labels.items() if k in names))
        drop = set(self.labels) | {"__name__"}
        return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))

    def match_labels(self, labels: Labels) -> Labels:
        """labels.MatchLabels(on, names...), for the duplicate-series error."""
        names = set(self.labels)
        if self.on:
            return {k: v for k, v in labels.items() if k in names}
        return {k: v for k, v in labels.items() if k not in names and k != "__name__"}


def result_metric(many: Labels, one: Labels, op: str, m: Matching, return_bool: bool) -> Labels:
    """resultMetric (+ the DropMetricName of `bool`)."""
    out = dict(many)
    if op in DROP_NAME:
        out.pop("__name__", None)
    if m.card == "one-to-one":
        if m.on:
            keep = set(m.labels)
            out = {k: v for k, v in out.items() if k in keep}
        else:
            for n in m.labels:
                out.pop(n, None)
    for n in m.include:
        v = one.get(n, "")
        if v:
            out[n] = v
        else:
            out.pop(n, None)
    if return_bool:
        out.pop("__name__", None)
    return out




# --------------------------------------------------------------------------------------
# VectorBinop at one step: the reference the vectorised path replays doubtful steps with
# --------------------------------------------------------------------------------------

Sample = tuple[Labels, float]


def binop_step(op: str, return_bool: bool, m: Matching, lhs: list[Sample],
                rhs: list[Sample]) -> list[Sample]:
    """VectorBinop at one step, followed by rangeEval's duplicate-labelset check; samples in
    evaluation order. The reference the vectorised path defers to."""
    if not lhs or not rhs:
        return []
    swapped = m.card == "one-to-many"
    if swapped:
        lhs, rhs = rhs, lhs
    right: dict[Key, Sample] = {}
    for rs in rhs:
        sig = m.signature(rs[0])
        if sig in right:
            one_side = "left" if swapped else "right"
            raise EvalError(
                f"found duplicate series for the match group {labels_string(m.match_labels(rs[0]))} "
                f"on the {one_side} hand-side of the operation: "
                f"[{labels_string(rs[0])}, {labels_string(right[sig][0])}]"
                ";many-to-many matching not allowed: matching labels must be unique on one side"
            )
        right[sig] = rs
    matched: dict[Key, set[Key] | None] = {}
    out: list[Sample] = []
    for ls in lhs:
        sig = m.signature(ls[0])
        match = right.get(sig)
        if match is None:
            continue
        rs = match
        vl, vr = ls[1], rs[1]
        if swapped:
            vl, vr = vr, vl
        value, keep = elem_op(op, vl, vr)
        if return_bool:
            value = 1.0 if keep else 0.0
        elif not keep:
            continue
        metric = result_metric(ls[0], rs[0], op, m, return_bool)
        if m.card == "one-to-one":
            if sig in matched:
                raise EvalError(ONE_TO_ONE_DUP)
            matched[sig] = None
        else:
            inserted = matched.get(sig)
            mk = label_key(metric)
            if inserted is None:
                inserted = matched[sig] = set()
            elif mk in inserted:
                raise EvalError(GROUP_DUP)
            inserted.add(mk)
        out.append((metric, value))
    if len({label_key(lab) for lab, _ in out}) != len(out):
        raise DuplicateLabelset()
    return out
