"""``spark-mq demo [ARGS]``: the end-to-end streaming demo, ``spark_mq.apps.demo``; everything after
``demo`` goes to the demo's own parser (``spark-mq demo --help`` shows its arguments)."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    demo = sub.add_parser("demo", help="run the end-to-end streaming demo (python -m spark_mq.apps.demo)",
                          add_help=False)
    demo.add_argument("demo_args", nargs=argparse.REMAINDER, help="arguments of the demo (see demo --help)")


def run(argv: list) -> int:
    from spark_mq.apps import demo
    return demo.main(argv)
