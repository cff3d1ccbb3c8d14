"""``spark-mq broker``: run the embedded Malamute broker in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import json
import time

from spark_mq.apps.commands.common import EXIT_OK, Failure, Stop, UsageError, err, protocol_of
from spark_mq.options import MALAMUTE

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    b = sub.add_parser("broker", help="run the embedded Malamute broker until Ctrl-C",
                       description="Run the embedded Malamute broker (wire-compatible with zeromq/malamute). "
                                   "Prints 'ready <endpoint>...' once bound, then serves until SIGINT/SIGTERM.")
    b.add_argument("--endpoint", "-e", action="append", dest="endpoints", metavar="ENDPOINT",
                   help="tcp://host:port or ipc://path to bind; repeatable (default tcp://127.0.0.1:9999; "
                        "port 0 picks a free port)")
    b.add_argument("--client-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="forget clients silent for this long (default 60)")
    b.add_argument("--credit", action="store_true", help="honour CREDIT flow control")
    b.add_argument("--mailbox-dir", metavar="DIR", help="persist mailboxes of offline clients in DIR")
    b.add_argument("--fsync", action="store_true", help="fsync the mailbox journal after every record")
    b.add_argument("--stats", type=float, default=0.0, metavar="SECONDS",
                   help="print the broker's counters every SECONDS (0: never)")
    b.add_argument("--seconds", type=float, default=0.0, help="stop after this many seconds (0: run until stopped)")
    b.add_argument("--log-level", default="WARNING", help="Python logging level (default WARNING)")


def run(args: argparse.Namespace) -> int:
    import logging

    import zmq

    from spark_mq.malamute_broker import DEFAULT_ENDPOINT, Broker
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for ep in args.endpoints or ():
        protocol = protocol_of(ep)
        if protocol != MALAMUTE:
            raise UsageError(f"--endpoint {ep!r}: the broker binds ZeroMQ endpoints, tcp://host:port or ipc://path")
    broker = Broker(args.endpoints or [DEFAULT_ENDPOINT], client_timeout=args.client_timeout, credit=args.credit,
                    mailbox_dir=args.mailbox_dir, fsync=args.fsync)
    try:
        broker.start()
    except zmq.ZMQError as exc:
        raise Failure(f"cannot bind {', '.join(args.endpoints or [DEFAULT_ENDPOINT])}: {exc}") from None
    print("ready " + " ".join(broker.endpoints), flush=True)
    deadline = time.monotonic() + args.seconds if args.seconds > 0 else None
    next_stats = time.monotonic() + args.stats if args.stats > 0 else None
    with Stop() as stop:
        try:
            while not stop.event.is_set():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                if broker.error is not None:
                    raise Failure(f"broker loop failed: {broker.error!r}")
                if next_stats is not None and now >= next_stats:
                    print("stats " + json.dumps(broker.stats, sort_keys=True), flush=True)
                    next_stats = now + args.stats
                stop.event.wait(0.2)
        finally:
            broker.stop()
    err("broker stopped")
    return EXIT_OK
