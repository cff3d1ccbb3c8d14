"""The ``spark-mq`` console command: the tool to reach for while building or debugging a pipeline.

Responsible for: the command line (``demo``, ``broker``, ``send``, ``tail``, ``bridge``, each a module of
``spark_mq.apps.commands``, which choose the protocol from the broker URI, turn flags into client
calls and print messages as text, JSON lines or raw bodies), and turning their errors into exit
statuses. Errors name the flag or URI at fault (passwords masked) and exit with status 2 (usage) or 1
(broker/connection failure). Not responsible for protocols or connections: it uses
``spark_mq.clients`` through ``spark_mq.clients.connect`` (the same URI/option parsing as the Spark
formats, so a URI that works here works in ``.option("uri", ...)``).

    spark-mq broker --endpoint tcp://127.0.0.1:9999
    spark-mq send tcp://127.0.0.1:9999 --stream orders --subject eu --body '{"id": {n}}' --count 10
    spark-mq tail tcp://127.0.0.1:9999 --stream orders --pattern 'eu.*' --json --max 10 --timeout 5
    spark-mq send amqp://guest:guest@127.0.0.1:5672/%2F orders --declare --file order.json
    spark-mq tail stomp://127.0.0.1:61613 /queue/orders --max 1 --output body

The URI scheme selects the protocol: ``amqp://``/``amqps://`` (AMQP 0-8), ``stomp://``/``stomp+ssl://``
(STOMP 1.0), ``tcp://``/``ipc://`` (Malamute). The optional positional TARGET is the queue (AMQP), the
destination (STOMP) or the stream (Malamute).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional
from urllib.parse import urlsplit

from spark_mq.apps.commands import bridge, broker, demo, send, tail
from spark_mq.apps.commands.common import (EXIT_FAILURE, EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE, Failure, UsageError,
                                           err, protocol_of, redact)

__all__ = ["main", "protocol_of", "UsageError", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INCOMPLETE"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spark-mq",
        description="spark-mq: Spark Structured Streaming over AMQP 0-8, STOMP 1.0 and Malamute. "
                    "URIs: amqp[s]://user:pass@host:5672/vhost, stomp[+ssl]://user:pass@host:61613, "
                    "tcp://host:9999 or ipc://path (Malamute).")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for command in (demo, broker, send, tail, bridge):  # the order of the help
        command.add_parser(sub)
    return p


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if argv and argv[0] == "demo":  # everything after "demo" belongs to the demo's own parser
        return demo.run(argv[1:])
    args = parser.parse_args(argv)
    if args.version:
        from spark_mq import __version__
        print(f"spark-mq {__version__}")
        return EXIT_OK
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from spark_mq.errors import SparkMqError
    handler = {"broker": broker.run, "send": send.run, "tail": tail.run, "bridge": bridge.run}[args.command]
    prog = f"spark-mq {args.command}"
    try:
        return handler(args)
    except UsageError as exc:
        err(f"{prog}: error: {exc}")
        return EXIT_USAGE
    except Failure as exc:
        err(f"{prog}: {exc}")
        return EXIT_FAILURE
    except BrokenPipeError:  # `spark-mq tail ... | head`
        try:
            sys.stdout.close()
        except OSError:
            pass
        return EXIT_OK
    except (SparkMqError, OSError, TimeoutError) as exc:
        text = f"{type(exc).__name__}: {exc}"
        uris = [u for u in (getattr(args, n, None) for n in ("uri", "from_uri", "to_uri")) if u]
        for uri in uris:
            parts = urlsplit(uri)
            if parts.password:
                text = text.replace(parts.password, "***")
        if uris:
            text += f" (URI {', '.join(redact(u) for u in uris)})"
        err(f"{prog}: {text}")
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
