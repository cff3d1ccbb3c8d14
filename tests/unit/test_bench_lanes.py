"""bench lanes: the median round per lane count, and its rate and reader CPU against one lane's."""

import pytest

from bench.bench_lanes import readme_rows, summary


def _run(rate, reader, kind="reader"):
    return {"msgs_per_s": rate, "seconds": 1.0, "in_batches_seconds": 1.0,
            "cpu_us_per_msg": {kind: reader, "jvm": 10.0}, "peer_ratio": 1.0}


def _round(peer, one, two, four, executors=None):
    r = {"peer": "pika", "peer_msgs_per_s": peer, "peer_cpu_us_per_msg": {"driver": 30.0},
         "1": _run(*one), "2": _run(*two), "4": _run(*four)}
    for key, fig in zip(("e1", "e2", "e4"), executors or ()):
        r[key] = _run(*fig, kind="pyworkers")
    return r


def test_each_lane_count_takes_its_own_median_round_and_compares_with_one_lane():
    measured = {"amqp08": [_round(20_000, (10_000, 40.0), (14_000, 42.0), (15_000, 44.0)),
                           _round(24_000, (12_000, 38.0), (11_000, 50.0), (16_000, 40.0)),
                           _round(22_000, (11_000, 39.0), (13_000, 41.0), (30_000, 39.0))]}
    out = summary(measured)["amqp08"]
    assert out["peer_msgs_per_s"] == 22_000
    assert out["1"]["msgs_per_s"] == 11_000 and out["1"]["rate_vs_1"] == 1.0
    assert out["2"]["msgs_per_s"] == 13_000
    assert out["2"]["rate_vs_1"] == pytest.approx(13 / 11)
    assert out["2"]["lane_cpu_vs_1"] == pytest.approx(41.0 / 39.0)
    assert out["4"]["msgs_per_s"] == 16_000 and out["4"]["lane_cpu_vs_1"] == pytest.approx(40.0 / 39.0)
    # the rounds themselves are kept unchanged
    assert "rate_vs_1" not in measured["amqp08"][1]["4"]


def test_the_readme_rows_name_rates_cpu_and_the_peer_per_placement():
    rows = summary({"stomp": [_round(20_000, (10_000, 40.0), (15_000, 40.0), (20_000, 60.0),
                                     executors=[(8_000, 30.0), (12_000, 31.5), (16_000, 33.0)])]})
    driver, executors = readme_rows(rows, 200_000, 1)
    assert driver[0] == "stomp source, consumers 1 / 2 / 4, ingest=driver"
    assert driver[2] == "10,000 / 15,000 / 20,000 msg/s"
    assert driver[3] == "x1.00 / x1.50 / x2.00 rate, reader CPU/msg x1.00 / x1.00 / x1.50 of 1 lane; 1 lane x0.50 of pika"
    # executors: compared with 1 lane on the executors, by the Python workers' CPU
    assert executors[0] == "stomp source, consumers 1 / 2 / 4, ingest=executors"
    assert executors[3] == "x1.00 / x1.50 / x2.00 rate, task CPU/msg x1.00 / x1.05 / x1.10 of 1 lane; 1 lane x0.40 of pika"


def test_a_placement_not_run_has_no_row():
    rows = summary({"amqp08": [_round(20_000, (10_000, 40.0), (15_000, 40.0), (20_000, 60.0))]})
    assert [r[0] for r in readme_rows(rows, 1000, 1)] == ["amqp08 source, consumers 1 / 2 / 4, ingest=driver"]
