"""Ingest group sizing: a group holds about ``fsyncBytes`` of bodies, within ``fsyncMessages`` (and,
with acks, half the prefetch). Pure arithmetic on an Ingest that is never started."""

from __future__ import annotations

import pytest

from spark_mq.options import SOURCE, parse_options
from spark_mq.sources.ingest import Ingest


def _ingest(tmp_path, fmt="malamute", **extra):
    base = {"uri": "tcp://127.0.0.1:1", "mailbox": "m"} if fmt == "malamute" else \
        {"uri": "amqp://guest:guest@127.0.0.1:1/%2F", "queue": "q"}
    opts = parse_options({**base, "logLocation": str(tmp_path / "log"), **extra}, format=fmt, direction=SOURCE)
    return Ingest(fmt, opts, connect=None)


def test_first_group_takes_the_count_limit(tmp_path):
    ing = _ingest(tmp_path)                        # malamute: no acks, so fsyncMessages alone
    assert ing._group_count == ing._group_limit == 20_000
    ing.log.close()


@pytest.mark.parametrize("body, count, expected", [
    (4096, 20_000, 256),      # 1 MiB of 4 KiB bodies
    (100, 20_000, 10_485),    # 1 MiB of 100 B bodies
    (10, 20_000, 20_000),     # small bodies: the count limit holds
    (4 << 20, 1, 1),          # a body larger than fsyncBytes: one per group, never zero
    (0, 500, 20_000),         # empty bodies count as one byte each
])
def test_groups_follow_the_last_mean_body_size(tmp_path, body, count, expected):
    ing = _ingest(tmp_path)
    ing._size_groups(body * count, count)
    assert ing._group_count == expected
    ing.log.close()


def test_groups_stay_within_half_the_prefetch_with_acks(tmp_path):
    ing = _ingest(tmp_path, fmt="amqp08", prefetch="1000", fsyncBytes="64k")
    assert ing._group_limit == 500
    ing._size_groups(10 * 100, 100)                # 64 KiB / 10 B would be 6553: capped at 500
    assert ing._group_count == 500
    ing._size_groups(1024 * 100, 100)              # 64 KiB / 1 KiB
    assert ing._group_count == 64
    ing.log.close()
