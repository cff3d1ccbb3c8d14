"""bench latency: its percentiles, the ratios to the floor, the measured window and the bodies."""

import pytest

from bench.bench_latency import BODY, body_of, in_window, percentile, pooled, summary, vs_floor


def test_percentile_interpolates_between_ranks_as_numpy_does():
    xs = [5, 1, 4, 2, 3]
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 5 and percentile(xs, 50) == 3
    assert percentile(xs, 25) == 2
    assert percentile([1, 2], 50) == 1.5
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([7], 99) == 7
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_is_in_milliseconds():
    s = summary([0.1, 0.2, 0.3, 0.4])
    assert s["n"] == 4 and s["p50_ms"] == 250.0 and s["max_ms"] == 400.0 and s["mean_ms"] == 250.0


def test_ratios_to_the_floor_and_the_targets():
    floor = {"p50_ms": 200.0, "p99_ms": 400.0}
    assert vs_floor({"p50_ms": 250.0, "p99_ms": 600.0}, floor) == {
        "p50_ratio": 1.25, "p99_ratio": 1.5, "meets_target": True}
    assert not vs_floor({"p50_ms": 251.0, "p99_ms": 400.0}, floor)["meets_target"]
    assert not vs_floor({"p50_ms": 200.0, "p99_ms": 601.0}, floor)["meets_target"]


def test_only_rows_sent_in_the_window_count():
    samples = [(9.99, 1.0), (10.0, 2.0), (15.0, 3.0), (20.0, 4.0)]
    assert in_window(samples, 10.0, 20.0) == [2.0, 3.0]


def test_a_body_carries_its_send_time():
    b = body_of(1764377362.123456)
    assert len(b) == BODY and float(b.decode()) == 1764377362.123456


def test_a_rows_passes_are_pooled():
    runs = [{"batches": 10, "rows_per_batch": 100.0, "batch_spacing_ms": 300.0, "collect_ms_median": 20.0,
             "spark_duration_ms_median": {"addBatch": 100, "latestOffset": 2}},
            {"batches": 20, "rows_per_batch": 50.0, "batch_spacing_ms": None, "collect_ms_median": 40.0,
             "spark_duration_ms_median": {"addBatch": 200}}]
    row = pooled([0.1, 0.2, 0.3, 0.4, 0.5], runs)
    assert row["p50_ms"] == 300.0 and row["n"] == 5  # the latencies of both passes, as one set
    assert row["batches"] == 30 and row["rows_per_batch"] == 75.0 and row["collect_ms_median"] == 30.0
    assert row["batch_spacing_ms"] == 300.0  # a pass without a spacing does not count
    assert row["spark_duration_ms_median"] == {"addBatch": 150.0, "latestOffset": 2.0}
    assert row["runs"] is runs
