"""Generated and duplicated files stay in step with the code that defines them.

- docs/options.md and docs/schema.md equal what scripts/gen_docs.py writes from the option and column
  definitions (regenerate with ``python scripts/gen_docs.py``);
- every notebook equals what notebooks/generate.py writes (``python notebooks/generate.py``);
- conf/spark/spark-defaults.conf and conf/logging/log4j2.properties are what the demo uses;
- every option that the parser accepts appears in the options reference.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rel", ["docs/options.md", "docs/schema.md"])
def test_generated_docs_are_fresh(rel):
    gen = _load(ROOT / "scripts" / "gen_docs.py")
    expected = gen.GENERATED[rel]()
    actual = (ROOT / rel).read_text()
    assert actual == expected, f"{rel} is stale: run `python scripts/gen_docs.py` and commit the result"


def test_options_reference_lists_every_option_of_every_format():
    gen = _load(ROOT / "scripts" / "gen_docs.py")
    gen._load()
    from spark_mq.options import SINK, SOURCE, registered
    text = (ROOT / "docs" / "options.md").read_text()
    for fmt in gen.FORMATS:
        for direction in (SOURCE, SINK):
            section = text.split(f"## `{fmt}` {direction}")[1].split("\n## ")[0]
            for spec in registered(fmt, direction):
                assert f"| `{spec.name}` |" in section, (fmt, direction, spec.name)


def test_notebooks_are_fresh():
    gen = _load(ROOT / "notebooks" / "generate.py")
    for name in gen.NOTEBOOKS:
        assert (ROOT / "notebooks" / name).read_text() == gen.render(name), (
            f"notebooks/{name} is stale: run `python notebooks/generate.py`")


def test_conf_files_are_what_the_demo_uses():
    from spark_mq.apps import demo
    assert (ROOT / "conf" / "logging" / "log4j2.properties").read_text() == demo.LOG4J2
    settings = {}
    for line in (ROOT / "conf" / "spark" / "spark-defaults.conf").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split(None, 1)
            settings[key] = value.strip()
    assert settings == demo.SPARK_DEFAULTS


def test_the_demo_runs_with_the_recommended_settings(tmp_path):
    from spark_mq.apps import demo
    settings = demo.spark_settings(str(tmp_path))
    assert {k: settings[k] for k in demo.SPARK_DEFAULTS} == demo.SPARK_DEFAULTS
    assert (tmp_path / "log4j2.properties").read_text() == demo.LOG4J2


@pytest.mark.parametrize("rel", ["README.md", "docs/getting-started.md"])
def test_compatibility_table_is_fresh(rel):
    """The Spark x feature table says what the version matrix (scripts/spark_matrix.py, checked release by
    release in tests/integration/test_spark_versions.py) tests; regenerate with ``python scripts/gen_docs.py``."""
    gen = _load(ROOT / "scripts" / "gen_docs.py")
    text = (ROOT / rel).read_text()
    assert gen.COMPAT_BEGIN in text and gen.COMPAT_END in text, f"{rel} lost its compatibility table markers"
    assert text == gen.with_compatibility_table(text), f"{rel}: the compatibility table is stale: run " \
                                                        f"`python scripts/gen_docs.py` and commit the result"
    import spark_matrix
    for r in spark_matrix.RELEASES:
        assert f"| {r.minor} ({r.version}) |" in text


def test_pyproject_states_the_tested_range():
    """pyproject's pyspark range is the minors the matrix tests: from the oldest to the newest."""
    import tomllib

    import spark_matrix
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pyspark = next(d for d in deps if d.startswith("pyspark"))
    oldest = spark_matrix.RELEASES[0]
    newest = spark_matrix.RELEASES[-1]
    major, minor = newest.minor.split(".")
    assert pyspark.replace(" ", "") == f"pyspark>={oldest.minor},<{major}.{int(minor) + 1}", pyspark
    assert [r.minor for r in spark_matrix.RELEASES] == ["4.0", "4.1", "4.2", "4.3"]


def test_bridge_mapping_table_is_fresh():
    gen = _load(ROOT / "scripts" / "gen_docs.py")
    text = (ROOT / gen.BRIDGE_FILE).read_text()
    assert gen.BRIDGE_BEGIN in text and gen.BRIDGE_END in text, "docs/bridges.md lost its table markers"
    assert text == gen.with_bridge_table(text), "docs/bridges.md: the mapping table is stale: run " \
        "`python scripts/gen_docs.py` and commit the result"
