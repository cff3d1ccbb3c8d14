"""Every notebook in notebooks/ runs top to bottom (nbclient, a real kernel of this environment)
against local Spark and the harness brokers, so the notebooks cannot rot. The notebooks check their
own results with asserts; a failing cell fails the test with the cell's error.

The broker URIs reach the notebooks through SPARK_MQ_AMQP_URI / SPARK_MQ_STOMP_URI; the Malamute
notebooks start the embedded broker themselves.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CELL_TIMEOUT = 300
RUN_TIMEOUT = 1150  # seconds a test waits for its notebook's run (queued behind at most the others)

pytestmark = [pytest.mark.timeout(1200),
              pytest.mark.xdist_group("test_notebooks")]  # one xdist worker: shared state (tests/conftest.py)


def execute(name: str, tmp_path: Path, **env) -> "object":
    """Run notebook ``name`` in a fresh kernel whose environment is this process's plus ``env``."""
    import os

    import nbclient
    import nbformat
    kernel_env = {k: v for k, v in os.environ.items() if k != "SPARK_MQ_MALAMUTE_URI"}
    kernel_env.update(env)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute(env=kernel_env)
    except nbclient.exceptions.CellExecutionError as exc:
        raise AssertionError(f"{name} failed:\n{str(exc)[-6000:]}") from None
    return nb


def outputs(nb) -> str:
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", ()):
            text.append(out.get("text", "") or "".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(text)


#: notebooks run side by side: each mostly waits on its kernel's Spark start and its queries; one at a time
#: under pytest-xdist, whose other workers keep the cores busy already
SIDE_BY_SIDE = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


@pytest.fixture(scope="module")
def runs(rabbitmq, activemq, tmp_path_factory):
    """Every notebook run, started at once, two at a time; each test waits for its own."""
    base = tmp_path_factory.mktemp("notebooks")
    plan = {
        "malamute": ("quickstart_malamute.ipynb", {}),
        "amqp08": ("quickstart_amqp08.ipynb", {"SPARK_MQ_AMQP_URI": rabbitmq.url("amqp")}),
        "stomp-rabbitmq": ("quickstart_stomp.ipynb", {"SPARK_MQ_STOMP_URI": rabbitmq.url("stomp")}),
        "stomp-activemq": ("quickstart_stomp.ipynb", {"SPARK_MQ_STOMP_URI": activemq.url("stomp")}),
        "databricks_emr": ("databricks_emr.ipynb", {"SPARK_MQ_BASE": str(base / "databricks_emr" / "base")}),
    }
    pool = ThreadPoolExecutor(max_workers=SIDE_BY_SIDE, thread_name_prefix="notebook")
    futures = {}
    for key, (name, env) in plan.items():
        work = base / key
        work.mkdir()
        futures[key] = pool.submit(execute, name, work, **env)
    try:
        yield futures
    finally:
        pool.shutdown(wait=True)


def test_notebooks_are_all_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(
        ["quickstart_malamute.ipynb", "quickstart_amqp08.ipynb", "quickstart_stomp.ipynb", "databricks_emr.ipynb"])


def test_quickstart_malamute(runs):
    assert "broker: tcp://127.0.0.1:" in outputs(runs["malamute"].result(RUN_TIMEOUT))


def test_quickstart_amqp08(runs):
    assert "rows: " in outputs(runs["amqp08"].result(RUN_TIMEOUT))


@pytest.mark.parametrize("broker", ["rabbitmq", "activemq"])
def test_quickstart_stomp(runs, broker):
    assert "rows: " in outputs(runs[f"stomp-{broker}"].result(RUN_TIMEOUT))


def test_databricks_emr_notebook_runs_locally(runs):
    text = outputs(runs["databricks_emr"].result(RUN_TIMEOUT))
    assert "Databricks: False EMR: False" in text
    assert "registered: ['amqp08', 'stomp', 'malamute']" in text
