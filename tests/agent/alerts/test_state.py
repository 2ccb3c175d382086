"""Alert state and templates, against Prometheus 2.42's rules/alerting.go and template/template.go."""

from __future__ import annotations

import math

import pytest

from vllm_sentinel.agent.alerts.state import (FIRING, INACTIVE, PENDING, AlertingRuleState, GroupEvaluator,
                                          RuleEvalError, eval_recording, samples_to_batches)
from vllm_sentinel.agent.alerts.gofmt import go_float, go_sprintf
from vllm_sentinel.agent.alerts.rulemodel import Rule, RuleGroup
from vllm_sentinel.agent.alerts.template_functions import (TemplateError, humanize, humanize1024, humanize_duration,
                                                           humanize_percentage)
from vllm_sentinel.agent.alerts.templating import check_template, expand_alert_template

S = 1000
M = 60_000


def alert_rule(for_ms: int = 0, keep_ms: int = 0, **kw) -> Rule:
    return Rule(name="A", kind="alert", expr="x > 1", for_ms=for_ms, keep_firing_for_ms=keep_ms,
                labels=kw.get("labels", {"severity": "high"}), annotations=kw.get("annotations", {}))


X = ({"__name__": "x", "instance": "a"}, 5.0)


def states(st: AlertingRuleState) -> list[str]:
    return [a.state for a in st.active_alerts()]


# -- templates ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value,text", [
    (0.0, "0"), (1e6, "1M"), (1234567.0, "1.235M"), (1e-6, "1u"), (0.3333333, "333.3m"), (-2500.0, "-2.5k"),
    (float("nan"), "NaN"), (float("inf"), "+Inf"),
])
def test_humanize_matches_prometheus(value: float, text: str) -> None:
    assert humanize(value) == text


def test_other_humanize_functions_match_prometheus() -> None:
    assert humanize1024(1048576) == "1Mi"
    assert humanize1024(0.5) == "0.5"
    assert humanize_duration(3600) == "1h 0m 0s"
    assert humanize_duration(90061) == "1d 1h 1m 1s"
    assert humanize_duration(1.5) == "1.5s"
    assert humanize_duration(0.1) == "100ms"
    assert humanize_duration(0) == "0s"
    assert humanize_percentage(0.1234567) == "12.35%"


@pytest.mark.parametrize("value,text", [
    (0.5, "0.5"), (1e6, "1e+06"), (100000.0, "100000"), (1234567.0, "1.234567e+06"), (1e-5, "1e-05"),
    (1 / 3, "0.3333333333333333"), (2.0, "2"), (float("-inf"), "-Inf"),
])
def test_value_prints_as_go(value: float, text: str) -> None:
    assert go_float(value) == text
    assert expand_alert_template("{{ $value }}", {}, value) == text


def test_template_subset() -> None:
    labels = {"instance": "a:8000", "model_name": "m"}
    assert expand_alert_template("{{ $labels.instance }}: {{ $value | humanize }}/s", labels, 1 / 3) == "a:8000: 333.3m/s"
    assert expand_alert_template("{{ .Labels.model_name }} {{ printf \"%.2f\" $value }}", labels, 2.5) == "m 2.50"
    assert expand_alert_template("{{ $value | printf \"%.1f\" }}", labels, 2.25) == "2.2"
    assert expand_alert_template("{{ if gt $value 1.0 }}high{{ else }}low{{ end }}", labels, 2.0) == "high"
    assert expand_alert_template("[{{ $labels.nope }}]", labels, 0) == "[]"  # missingkey=zero
    assert expand_alert_template("a {{- \" b \" -}} c", labels, 0) == "a b c"
    assert expand_alert_template("{{ $externalLabels.cluster }}", labels, 0, {"cluster": "c1"}) == "c1"
    assert expand_alert_template("{{ range $k, $v := $labels }}{{ $k }}={{ $v }};{{ end }}", labels, 0) == \
        "instance=a:8000;model_name=m;"
    assert go_sprintf("%d items", 3) == "3 items"
    assert go_sprintf("%d", 1.5) == "%!d(float64=1.5)"


def test_template_errors_name_the_problem() -> None:
    with pytest.raises(TemplateError, match='function "bogus" not defined'):
        check_template("{{ bogus $value }}")
    with pytest.raises(TemplateError, match="missing {{end}}"):
        check_template("{{ if $value }}x")
    with pytest.raises(TemplateError, match="not supported"):
        check_template('{{ template "x" }}')


# -- alert state ------------------------------------------------------------------------------
def test_for_boundary_pair_pending_then_firing() -> None:
    st = AlertingRuleState(alert_rule(for_ms=1 * M))
    for t in range(0, 60 * S, 15 * S):  # 0s .. 45s: active for less than `for`
        st.eval([X], t)
        assert states(st) == [PENDING], t
    st.eval([X], 60 * S)  # exactly `for` after the first evaluation that returned it
    assert states(st) == [FIRING]
    a = st.active_alerts()[0]
    assert (a.active_at_ms, a.fired_at_ms) == (0, 60 * S)
    assert a.labels == {"alertname": "A", "instance": "a", "severity": "high"}


def test_pending_alert_that_goes_away_never_fires() -> None:
    st = AlertingRuleState(alert_rule(for_ms=1 * M))
    st.eval([X], 0)
    st.eval([], 15 * S)
    assert st.active == {}
    st.eval([X], 30 * S)  # back again: `for` starts over
    st.eval([X], 75 * S)
    assert states(st) == [PENDING]
    st.eval([X], 90 * S)
    assert states(st) == [FIRING]


def test_for_zero_fires_at_once_and_resolves() -> None:
    st = AlertingRuleState(alert_rule())
    st.eval([X], 0)
    assert states(st) == [FIRING]
    st.eval([], 15 * S)
    assert st.active_alerts() == []
    a = next(iter(st.active.values()))  # kept 15 minutes as resolved, as Prometheus does
    assert (a.state, a.resolved_at_ms) == (INACTIVE, 15 * S)
    st.eval([], 15 * S + 15 * M + 1)
    assert st.active == {}


def test_keep_firing_for_boundary_pair() -> None:
    st = AlertingRuleState(alert_rule(keep_ms=1 * M))
    st.eval([X], 0)
    for t in range(15 * S, 75 * S, 15 * S):  # condition gone at 15s: keeps firing until 15s + 1m
        st.eval([], t)
        assert states(st) == [FIRING], t
    st.eval([], 75 * S)
    assert st.active_alerts() == []


def test_keep_firing_for_resets_when_condition_returns() -> None:
    st = AlertingRuleState(alert_rule(keep_ms=1 * M))
    st.eval([X], 0)
    st.eval([], 15 * S)
    st.eval([X], 30 * S)  # back: the keep-firing clock resets
    st.eval([], 45 * S)
    st.eval([], 100 * S)
    assert states(st) == [FIRING]
    st.eval([], 105 * S)
    assert st.active_alerts() == []


def test_labels_and_annotations_are_templated_each_evaluation() -> None:
    rule = alert_rule(labels={"severity": "{{ if gt $value 10.0 }}critical{{ else }}high{{ end }}"},
                      annotations={"summary": "{{ $labels.instance }} at {{ $value }}"})
    st = AlertingRuleState(rule)
    st.eval([X], 0)
    assert st.active_alerts()[0].annotations == {"summary": "a at 5"}
    st.eval([(X[0], 7.0)], 15 * S)
    assert st.active_alerts()[0].annotations == {"summary": "a at 7"}
    st.eval([(X[0], 50.0)], 30 * S)  # the severity label changes: a different alert
    sev = sorted(a.labels["severity"] for a in st.active_alerts())
    assert sev == ["critical"]


def test_same_labelset_after_rule_labels_is_an_error() -> None:
    st = AlertingRuleState(alert_rule())
    with pytest.raises(RuleEvalError, match="same labelset"):
        st.eval([({"__name__": "x", "i": "1"}, 2.0), ({"__name__": "y", "i": "1"}, 3.0)], 0)


def test_limit_clears_alerts() -> None:
    st = AlertingRuleState(alert_rule())
    with pytest.raises(RuleEvalError, match="exceeded limit of 1 with 2 alerts"):
        st.eval([({"i": "1"}, 2.0), ({"i": "2"}, 3.0)], 0, limit=1)
    assert st.active == {}


def test_alerts_series_samples() -> None:
    st = AlertingRuleState(alert_rule(for_ms=1 * M))
    out = st.eval([X], 30 * S)
    assert ({"__name__": "ALERTS", "alertname": "A", "alertstate": "pending", "instance": "a", "severity": "high"},
            1.0) in out
    assert ({"__name__": "ALERTS_FOR_STATE", "alertname": "A", "instance": "a", "severity": "high"}, 30.0) in out


# -- recording rules and groups ----------------------------------------------------------------
def test_recording_rule_renames_and_labels() -> None:
    rule = Rule(name="job:x:sum", kind="record", expr="x", labels={"team": "t", "drop": ""})
    out = eval_recording(rule, [({"__name__": "x", "drop": "1", "a": "1"}, 2.0)])
    assert out == [({"__name__": "job:x:sum", "a": "1", "team": "t"}, 2.0)]


def test_group_writes_staleness_markers_for_vanished_series() -> None:
    answers = {0: [({"a": "1"}, 1.0), ({"a": "2"}, 2.0)], 1000: [({"a": "1"}, 3.0)]}
    written: list = []
    rule = Rule(name="r", kind="record", expr="x")
    ev = GroupEvaluator([RuleGroup("g", [rule])], lambda expr, t: [_S(l, v) for l, v in answers[t]],
                        lambda t, samples: written.append((t, samples)))
    ev.eval(0)
    ev.eval(1000)
    assert written[1] == (1000, [({"a": "1", "__name__": "r"}, 3.0), ({"a": "2", "__name__": "r"}, None)])


def test_group_reports_bad_result_type_as_rule_error() -> None:
    rule = Rule(name="r", kind="record", expr="x[1m]")
    ev = GroupEvaluator([RuleGroup("g", [rule])], lambda expr, t: [_Series({}, [])])
    assert ev.eval(0)[0].error == "rule result is not a vector or scalar"


def test_scalar_result_is_one_sample_without_labels() -> None:
    rule = Rule(name="r", kind="record", expr="1")
    written: list = []
    GroupEvaluator([RuleGroup("g", [rule])], lambda e, t: 1.0, lambda t, s: written.extend(s)).eval(0)
    assert written == [({"__name__": "r"}, 1.0)]


def test_samples_to_batches_split_by_instance() -> None:
    batches = samples_to_batches(5, [({"__name__": "r", "instance": "a", "k": "v"}, 1.0),
                                     ({"__name__": "r"}, None)])
    assert [(b.instance, b.metrics, b.labels, b.values) for b in batches] == [
        ("a", ["r"], ['k="v"'], [1.0]), ("", ["r"], [""], [None])]


class _S:
    def __init__(self, labels: dict, value: float):
        self.labels, self.value = labels, value


class _Series:
    def __init__(self, labels: dict, points: list):
        self.labels, self.points = labels, points


def test_nan_value_is_kept() -> None:
    st = AlertingRuleState(alert_rule())
    st.eval([({"i": "1"}, float("nan"))], 0)
    assert math.isnan(st.active_alerts()[0].value)


def test_alerts_evaluated_without_annotations_get_the_same_ones_from_annotate() -> None:
    """A replay expands annotations once, at an incident's last firing step, from the alert's sample: the
    same text an evaluation with annotations gives, a template error included; static labels are their text."""
    rule = alert_rule(labels={"severity": "high", "tier": "{{ $labels.instance }}-x"},
                      annotations={"summary": "{{ $labels.instance }}: {{ $value | humanize }}",
                                   "static": "no action }} here", "bad": "{{ $value | nosuchfn }}"})
    full, lean = AlertingRuleState(rule), AlertingRuleState(rule)
    for t, v in ((0, 5.0), (S, 7.5), (2 * S, 1234.0)):
        sample = [({"__name__": "x", "instance": "a"}, v)]
        full.eval(sample, t)
        lean.eval(sample, t, annotate=False)
    [a], [b] = full.active_alerts(), lean.active_alerts()
    assert a.labels == b.labels and a.labels["tier"] == "a-x" and a.labels["severity"] == "high"
    assert b.annotations == {}
    assert lean.annotate(b.expr_labels, b.value) == a.annotations
    assert a.annotations["summary"] == "a: 1.234k" and a.annotations["static"] == "no action }} here"
    assert a.annotations["bad"].startswith("<error expanding template:")
