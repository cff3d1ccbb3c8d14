"""bench/bench_rabbitmq4.py's reporting: the median round of each pair (the broker runs: ./dev bench)."""

from bench.bench_rabbitmq4 import _median_round


def test_each_pair_reports_its_median_round():
    rounds = [{"round": 0, "a": 1.2, "b": 0.5}, {"round": 1, "a": 0.9, "b": 0.7}, {"round": 2, "a": 1.0, "b": 0.6}]
    assert _median_round(rounds, "a")["round"] == 2
    assert _median_round(rounds, "b")["round"] == 2
    assert _median_round(rounds[:2], "a")["round"] == 1  # of two, the lower: never the flattering one
