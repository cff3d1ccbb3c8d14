"""The bridge benchmark's CPU figures: per message, by process, and the ratio the cores allow."""

from bench.bench_bridges import cpu_figures


def test_cpu_per_message_and_the_ratio_the_cores_allow():
    # 10,000 messages; the source took 2 CPU-s, the sink 3, the bridge 6 (more than both together)
    f = cpu_figures(10_000, {"broker": 1.5, "reader": 0.5}, {"broker": 1.0, "pyworkers": 2.0},
                    {"broker": 3.0, "reader": 1.0, "pyworkers": 2.0}, slower_rate=4_000.0, cores=2)
    assert f["source_cpu_us_per_msg"] == {"broker": 150.0, "reader": 50.0}
    assert f["cpu_us_per_msg"] == {"source": 200.0, "sink": 300.0, "bridge": 600.0}
    # 2 cores / 500 us per message = 4,000 msg/s at best, the slower end's own rate: ratio 1.0 at most
    assert f["cpu_bound_ratio"] == 1.0
    # ends that each fill the cores (the slower end 4,000 msg/s at 500 us): together at most 0.5
    assert cpu_figures(10_000, {"a": 5.0}, {"a": 5.0}, {"a": 10.0}, 4_000.0, 2)["cpu_bound_ratio"] == 0.5
