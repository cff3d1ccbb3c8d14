"""Repository-wide rules: layering, CI entry point, README figures."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_PROTOCOL = {"socket", "ssl", "threading", "time", "zmq", "select", "asyncio", "selectors"}


@pytest.mark.parametrize("package", sorted(p.name for p in (ROOT / "spark_mq" / "protocol").iterdir()
                                           if p.is_dir() and not p.name.startswith("_")))
def test_protocol_cores_are_sans_io(package):
    """Layer 1 imports no sockets, threads, clocks or zmq, and nothing from the layers above it."""
    for path in (ROOT / "spark_mq" / "protocol" / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in FORBIDDEN_IN_PROTOCOL, f"{path.relative_to(ROOT)} imports {name}"
                assert not name.startswith(("spark_mq.transport", "spark_mq.clients", "spark_mq.sources",
                                            "spark_mq.sinks")), f"{path.relative_to(ROOT)} imports {name}"


def test_transport_does_not_import_clients_or_spark():
    for path in (ROOT / "spark_mq" / "transport").rglob("*.py"):
        text = path.read_text()
        for upper in ("spark_mq.clients", "spark_mq.sources", "spark_mq.sinks", "pyspark"):
            assert upper not in text, f"{path.relative_to(ROOT)} mentions {upper}"


TEST_HELPERS = {"sinktest", "broker_process"}  # tests/integration modules that tests, bench and soak import


def test_no_test_helper_ships_in_the_package():
    """The wheel (packages spark_mq*) and the --py-files zip (spark_mq/**/*.py) take the spark_mq tree:
    no ``testing`` module there, and nothing there imports the test helpers of tests/integration."""
    for path in (ROOT / "spark_mq").rglob("*.py"):
        rel = path.relative_to(ROOT)
        assert path.stem not in {"testing", "tests", "conftest"} | TEST_HELPERS, f"{rel} is a test module in the package"
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                top = name.split(".")[0]
                assert top not in TEST_HELPERS | {"tests", "brokers"}, f"{rel} imports the test helper {name}"
                assert not name.endswith(".testing"), f"{rel} imports {name}"
    for helper in TEST_HELPERS:
        assert (ROOT / "tests" / "integration" / f"{helper}.py").is_file()


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.startswith("#")
                and not line.startswith(("set ", "cd "))]
    assert commands == ["exec ./dev test"]
    readme = (ROOT / "README.md").read_text()
    assert "./dev test" in readme.split("##")[0]  # the opening of the README names it
    assert "./dev demo" in readme.split("##")[0]


def test_readme_performance_table_matches_latest_results():
    result = subprocess.run([sys.executable, "-m", "bench.report", "--check"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_benchmark_page_and_plots_match_latest_results():
    """docs/benchmarks.md shows the figures of bench/results, and each PNG it embeds was drawn from them."""
    result = subprocess.run([sys.executable, "-m", "bench.plots", "--check"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for name in ("clients.png", "sources.png", "sinks.png"):
        assert f"(bench/{name})" in page


def test_formats_resolve_without_register_from_any_directory(tmp_path):
    """pyspark finds data sources with pkgutil.iter_modules() (pyspark/sql/worker/lookup_data_sources.py):
    in the environment running the tests (./dev's editable install), from a directory outside the
    repository, the three pyspark_* modules must be listed and expose DefaultSource."""
    code = ("import pkgutil, importlib\n"
            "names = sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_'))\n"
            "print(' '.join(f'{n}:{importlib.import_module(n).DefaultSource.name()}' for n in names))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    found = set(result.stdout.split())
    assert {"pyspark_amqp08:amqp08", "pyspark_stomp:stomp", "pyspark_malamute:malamute"} <= found, found
