"""``spark-mq bridge FROM_URI TO_URI``: the command line of the bridge; the job itself (the Spark
query, its state and its progress line) is ``spark_mq.apps.bridge_job``."""

from __future__ import annotations

import argparse

from spark_mq.apps.commands.common import UsageError, protocol_of

__all__ = ["add_parser", "run"]

_BRIDGE_DESC = """\
Move messages between brokers: a Spark query reads FROM_URI and writes TO_URI, each source row written
as it is (docs/bridges.md: headers, properties and ids carried). Runs until Ctrl-C, or with
--available-now until what was there is bridged. Run the same command again to resume (--state).
  bridge stomp://legacy:61613 amqp://guest:guest@rabbit:5672/%2F --from /queue/orders --to orders
  bridge tcp://127.0.0.1:9999 amqp://... --from stream:weather --to weather -O deliveryMode=2"""


def add_parser(sub) -> None:
    br = sub.add_parser("bridge", help="move messages from one broker to another with a Spark query",
                        description=_BRIDGE_DESC, formatter_class=argparse.RawDescriptionHelpFormatter)
    br.add_argument("from_uri", metavar="FROM_URI", help="source broker URI; the scheme selects the protocol")
    br.add_argument("to_uri", metavar="TO_URI", help="sink broker URI")
    br.add_argument("--from", dest="source", required=True, metavar="TARGET",
                    help="AMQP queue, STOMP destination, or Malamute stream:NAME / mailbox:NAME / service:NAME")
    br.add_argument("--to", dest="sink", required=True, metavar="TARGET",
                    help="AMQP routing key (default exchange), STOMP destination, or Malamute stream:/mailbox:/service:NAME")
    br.add_argument("--state", metavar="DIR", help="source log and checkpoint (default: ./spark-mq-bridge-<hash of "
                    "the URIs and targets>); the same command resumes from it")
    br.add_argument("--available-now", action="store_true", help="bridge what is there now, then exit")
    br.add_argument("--source-option", "-I", action="append", metavar="KEY=VALUE", help="any source option")
    br.add_argument("--sink-option", "-O", action="append", metavar="KEY=VALUE", help="any sink option")
    br.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    br.add_argument("--trigger-interval", type=float, default=1.0, metavar="SECONDS",
                    help="micro-batch interval when not --available-now (default 1)")
    br.add_argument("--progress-interval", type=float, default=2.0, metavar="SECONDS",
                    help="seconds between progress lines (default 2)")


def run(args: argparse.Namespace) -> int:
    from spark_mq.apps import bridge_job
    for flag, uri in (("FROM_URI", args.from_uri), ("TO_URI", args.to_uri)):
        try:
            protocol_of(uri)
        except UsageError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    try:
        return bridge_job.run(args)
    except bridge_job.BridgeUsageError as exc:
        raise UsageError(str(exc)) from None
