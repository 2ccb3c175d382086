"""agent/daemon/file_sd.py: Prometheus file_sd files (JSON and YAML) -> targets, and one-line errors with file:line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_sentinel.agent.daemon.file_sd import TargetsFile, TargetsFileError, parse_targets


def test_yaml_and_json_give_the_same_targets_with_prometheus_meta_labels():
    yaml_text = ("- targets: ['10.0.0.5:8000', 10.0.0.6:8001]\n"
                 "  labels: {job: vllm, __scheme__: https, __metrics_path__: /custom, __meta_x: dropped}\n"
                 "- targets: ['10.0.0.7:8000']\n"
                 "  labels: {instance: replica-7}\n")
    json_text = ('[\n\t{"targets": ["10.0.0.5:8000", "10.0.0.6:8001"],\n\t "labels": {"job": "vllm", '
                 '"__scheme__": "https", "__metrics_path__": "/custom", "__meta_x": "dropped"}},\n'
                 '\t{"targets": ["10.0.0.7:8000"], "labels": {"instance": "replica-7"}}\n]\n')
    y = parse_targets(yaml_text.encode(), Path("t.yaml"))
    j = parse_targets(json_text.encode(), Path("t.json"))
    assert [(s.url, s.instance, s.labels) for s in y] == [(s.url, s.instance, s.labels) for s in j] == [
        ("https://10.0.0.5:8000/custom", "10.0.0.5:8000", (("job", "vllm"),)),
        ("https://10.0.0.6:8001/custom", "10.0.0.6:8001", (("job", "vllm"),)),
        ("http://10.0.0.7:8000/metrics", "replica-7", ()),
    ]
    assert [s.source for s in y] == ["t.yaml:1", "t.yaml:1", "t.yaml:3"]
    assert [s.source for s in j] == ["t.json:2", "t.json:2", "t.json:4"]
    assert parse_targets(b"[]", Path("t.yaml")) == []


@pytest.mark.parametrize("name, text, expected", [
    ("t.yaml", "targets: [a:1]\n", "t.yaml:1: the file must be a list of target groups"),
    ("t.yaml", "- [a:1]\n", "t.yaml:1: each entry must be a mapping with `targets`"),
    ("t.yaml", "- targets: a:1\n", "t.yaml:1: `targets` must be a list of host:port"),
    ("t.yaml", "- targets: [a:1]\n  labels: [job]\n", "t.yaml:2: `labels` must be a mapping"),
    ("t.yaml", "- targets: [a:1]\n  labels: {job: ~}\n", "t.yaml:2: label job must have a string value"),
    ("t.yaml", "- targets: [a:1]\n  labels: {a-b: x}\n", "t.yaml:2: 'a-b' is not a valid label name"),
    ("t.yaml", "- targets: [a:1]\n- targets: [b:2, a:1]\n", "t.yaml:2: instance a:1 is already listed at t.yaml:1"),
    ("t.yaml", "- targets: ['a:x']\n", "t.yaml:1: target 'http://a:x/metrics' has an invalid port"),
    ("t.yaml", "- targets: [a:1\n", "t.yaml:2: not valid YAML"),
    ("t.json", '[{"targets": ["a:1"]}\n,]', "t.json:2: not valid JSON"),
    ("t.toml", "[]", "t.toml: a targets file must end in .json, .yml or .yaml"),
    ("t.yaml", " \n", "t.yaml: the targets file is empty; write [] to mean no targets"),
    ("t.yaml", b"\xff\xfe", "t.yaml: not UTF-8 text"),
])
def test_bad_targets_files_name_the_line_and_the_fix(name, text, expected):
    data = text if isinstance(text, bytes) else text.encode()
    with pytest.raises(TargetsFileError) as e:
        parse_targets(data, Path(name))
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_changed_is_true_only_for_new_content(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("- targets: [a:1]\n")
    f = TargetsFile(path)
    assert f.changed()
    f.read()
    assert not f.changed()
    os.utime(path, ns=(1, 1))  # touched, same bytes: nothing to apply
    assert not f.changed()
    path.write_text("- targets: [a:1, b:2]\n")
    assert f.changed() and len(f.read()) == 2
    path.unlink()
    assert f.changed()  # once, so a reload reports it
    assert not f.changed()
    with pytest.raises(TargetsFileError, match="cannot read the targets file"):
        f.read()
