"""Every notebook in notebooks/ runs top to bottom (nbclient, a real kernel of this environment)
against local Spark and the harness brokers, so the notebooks cannot rot. The notebooks check their
own results with asserts; a failing cell fails the test with the cell's error.

The broker URIs reach the notebooks through SPARK_MQ_AMQP_URI / SPARK_MQ_STOMP_URI; the Malamute
notebooks start the embedded broker themselves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CELL_TIMEOUT = 300

pytestmark = pytest.mark.timeout(900)


def execute(name: str, monkeypatch, tmp_path, **env) -> "object":
    import nbclient
    import nbformat
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SPARK_MQ_MALAMUTE_URI", raising=False)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        raise AssertionError(f"{name} failed:\n{str(exc)[-6000:]}") from None
    return nb


def outputs(nb) -> str:
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", ()):
            text.append(out.get("text", "") or "".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(text)


def test_notebooks_are_all_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(
        ["quickstart_malamute.ipynb", "quickstart_amqp08.ipynb", "quickstart_stomp.ipynb", "databricks_emr.ipynb"])


def test_quickstart_malamute(monkeypatch, tmp_path):
    nb = execute("quickstart_malamute.ipynb", monkeypatch, tmp_path)
    assert "broker: tcp://127.0.0.1:" in outputs(nb)


def test_quickstart_amqp08(rabbitmq, monkeypatch, tmp_path):
    nb = execute("quickstart_amqp08.ipynb", monkeypatch, tmp_path, SPARK_MQ_AMQP_URI=rabbitmq.url("amqp"))
    assert "rows: " in outputs(nb)


@pytest.mark.parametrize("broker", ["rabbitmq", "activemq"])
def test_quickstart_stomp(broker, request, monkeypatch, tmp_path):
    handle = request.getfixturevalue(broker)
    nb = execute("quickstart_stomp.ipynb", monkeypatch, tmp_path, SPARK_MQ_STOMP_URI=handle.url("stomp"))
    assert "rows: " in outputs(nb)


def test_databricks_emr_notebook_runs_locally(monkeypatch, tmp_path):
    nb = execute("databricks_emr.ipynb", monkeypatch, tmp_path, SPARK_MQ_BASE=str(tmp_path / "base"))
    text = outputs(nb)
    assert "Databricks: False EMR: False" in text
    assert "registered: ['amqp08', 'stomp', 'malamute']" in text
