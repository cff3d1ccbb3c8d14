"""Layering: the Malamute protocol package and the broker's routing core do no IO of their own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import spark_mq

ROOT = Path(spark_mq.__file__).resolve().parent
FORBIDDEN = {"zmq", "socket", "threading", "time", "select", "asyncio"}
SANS_IO = sorted((ROOT / "protocol" / "malamute").glob("*.py")) + [ROOT / "protocol" / "zmtp.py", ROOT / "malamute_broker" / "core.py"]


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", SANS_IO, ids=lambda p: p.name)
def test_sans_io_modules_import_no_io(path):
    assert imported_roots(path) & FORBIDDEN == set()


def test_protocol_does_not_import_upper_layers():
    for path in sorted((ROOT / "protocol" / "malamute").glob("*.py")):
        text = path.read_text()
        assert "spark_mq.clients" not in text and "spark_mq.malamute_broker" not in text, path.name
