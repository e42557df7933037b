"""The Prometheus text the engine serves at /metrics, read by operations/util/prometheus.py."""

from __future__ import annotations

import math

import pytest

from operations.util import prometheus as prom

TEXT = """\
# HELP tensorfold_requests_total Completion requests received.
# TYPE tensorfold_requests_total counter
tensorfold_requests_total{model="DeepSeek-V4.1-Flash-1017"} 12
tensorfold_requests_total{model="alias"} 3 1790000000000

# TYPE tensorfold_requests_inflight gauge
tensorfold_requests_inflight 1.5
# a comment that is not HELP or TYPE
# TYPE tensorfold_ttft_seconds histogram
tensorfold_ttft_seconds_bucket{le="0.5"} 4
tensorfold_ttft_seconds_bucket{le="+Inf"} 9
tensorfold_ttft_seconds_sum 7.25
tensorfold_ttft_seconds_count 9
# TYPE tensorfold_latency_seconds summary
tensorfold_latency_seconds{quantile="0.5"} 0.2
tensorfold_latency_seconds_count 9
process_open_fds 17
"""


def test_samples_with_their_labels_and_values():
    found = prom.parse(TEXT)
    assert found.samples[:3] == [
        prom.Sample("tensorfold_requests_total", {"model": "DeepSeek-V4.1-Flash-1017"}, 12.0),
        prom.Sample("tensorfold_requests_total", {"model": "alias"}, 3.0),  # a timestamp is read past
        prom.Sample("tensorfold_requests_inflight", {}, 1.5),
    ]
    assert found.types == {"tensorfold_requests_total": "counter", "tensorfold_requests_inflight": "gauge",
                           "tensorfold_ttft_seconds": "histogram", "tensorfold_latency_seconds": "summary"}
    assert len(found.samples) == 10


def test_totals_add_each_metric_over_its_labels_and_leave_histograms_and_summaries_out():
    assert prom.totals(prom.parse(TEXT)) == {"tensorfold_requests_total": 15.0, "tensorfold_requests_inflight": 1.5,
                                             "process_open_fds": 17.0}
    assert prom.totals(prom.parse(TEXT), ["tensorfold_requests_total"]) == {"tensorfold_requests_total": 15.0}
    assert prom.totals(prom.parse(TEXT), ["no_such_metric"]) == {}


@pytest.mark.parametrize("line, labels", [
    (r'm{path="C:\\dir",say="a \"quote\""} 1', {"path": "C:\\dir", "say": 'a "quote"'}),
    (r'm{text="two\nlines"} 1', {"text": "two\nlines"}),
    ('m{a="x,y}",b="}"} 1', {"a": "x,y}", "b": "}"}),  # commas and braces inside a value
    ('m{a="1",} 1', {"a": "1"}),  # a trailing comma is allowed
    ('m { a = "1" } 1', {"a": "1"}),  # blanks around the labels
    ('m{a="1"}1', {"a": "1"}),
    ("m{} 1", {}),
])
def test_label_values_are_unescaped(line, labels):
    sample = prom.parse_sample(line)
    assert (sample.labels if sample else None) == labels


def test_special_values():
    values = [prom.parse_sample(f"m {v}") for v in ("NaN", "+Inf", "-Inf", "1e3", "-0.5")]
    assert math.isnan(values[0].value) and [v.value for v in values[1:]] == [math.inf, -math.inf, 1000.0, -0.5]
    # a NaN or an infinity would make the sum say nothing: left out
    assert prom.totals(prom.parse("m NaN\nm 2\nm +Inf\ng -Inf\n")) == {"m": 2.0}


@pytest.mark.parametrize("line", [
    "m",  # no value
    "m one",
    "m 1 2 3",
    "m 1 soon",  # a timestamp is a whole number of milliseconds
    'm{a="1" b="2"} 1',  # labels without their comma
    'm{a=1} 1',  # an unquoted value
    'm{a="1"',  # never closed
    "9m 1",  # a name does not start with a digit
    "m-1",
])
def test_a_line_that_does_not_parse_is_left_out(line):
    assert prom.parse_sample(line) is None
    assert prom.parse(f"{line}\ngood 1\n").samples == [prom.Sample("good", {}, 1.0)]


def test_family_types_of_series_names():
    types = {"h": "histogram", "s": "summary", "c": "counter"}
    assert [prom.family_type(n, types) for n in ("h_bucket", "h_sum", "s_count", "c_total", "c", "x", "x_sum")] == [
        "histogram", "histogram", "summary", "counter", "counter", "untyped", "untyped"]
