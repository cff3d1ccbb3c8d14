"""Command line: ``python -m spark_mq.malamute_broker [--endpoint EP ...] [options]``.

Prints ``ready <endpoint> ...`` on stdout once bound (a harness can wait for it and read the
actual port when asked for port 0), then serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from spark_mq.malamute_broker.core import Limits
from spark_mq.malamute_broker.server import DEFAULT_ENDPOINT, Broker


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m spark_mq.malamute_broker",
                                description="Malamute broker (wire-compatible with zeromq/malamute)")
    p.add_argument("--endpoint", "-e", action="append", dest="endpoints", metavar="ENDPOINT",
                   help=f"ZeroMQ endpoint to bind, tcp://host:port or ipc://path; repeatable (default {DEFAULT_ENDPOINT})")
    p.add_argument("--client-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="forget clients silent for this long (default 60, like the reference engine)")
    p.add_argument("--credit", action="store_true",
                   help="honour CREDIT (flow control); off by default since reference clients never send it")
    p.add_argument("--mailbox-dir", metavar="DIR", help="persist mailboxes of offline clients in DIR")
    p.add_argument("--fsync", action="store_true", help="fsync the mailbox journal after every record")
    p.add_argument("--max-queue", type=int, default=Limits.max_mailbox, metavar="N",
                   help="bound on stored messages per mailbox, per service queue and per credit window")
    p.add_argument("--hwm", type=int, default=100_000, help="ZeroMQ high-water mark of the ROUTER socket")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    limits = Limits(max_mailbox=args.max_queue, max_service_queue=args.max_queue, max_held=args.max_queue)
    broker = Broker(args.endpoints or [DEFAULT_ENDPOINT], client_timeout=args.client_timeout, credit=args.credit,
                    limits=limits, mailbox_dir=args.mailbox_dir, fsync=args.fsync, hwm=args.hwm)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    broker.bind()
    print("ready " + " ".join(broker.endpoints), flush=True)
    broker.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
