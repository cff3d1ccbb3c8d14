"""scripts/jvm_archive.py: which archive a venv's drivers use, and what they are given (issue 56).
That a real driver maps it: tests/integration/test_harness.py."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import jvm_archive  # noqa: E402


def _fake_venv(root: Path, jars: dict) -> Path:
    site = root / "lib" / "python3.11" / "site-packages" / "pyspark" / "jars"
    site.mkdir(parents=True)
    for name, size in jars.items():
        (site / name).write_bytes(b"x" * size)
    (root / "bin").mkdir()
    return root / "bin" / "python"


def test_the_key_follows_the_jdk_the_jars_and_the_options(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_MQ_CACHE", str(tmp_path / "cache"))
    a = _fake_venv(tmp_path / "a", {"spark-core.jar": 10, "spark-sql.jar": 20})
    first = jvm_archive.archive_path(a, "jdk 17.0.15")
    assert first.parent == tmp_path / "cache" / "jvm-cds" and first.suffix == ".jsa"
    assert jvm_archive.archive_path(a, "jdk 17.0.15") == first  # stable
    assert jvm_archive.archive_path(a, "jdk 17.0.16") != first  # another JDK build
    (a.parent.parent / "lib/python3.11/site-packages/pyspark/jars/spark-sql.jar").write_bytes(b"y" * 21)
    changed = jvm_archive.archive_path(a, "jdk 17.0.15")
    assert changed != first  # another jar
    monkeypatch.setattr(jvm_archive, "JAVA_OPTIONS", jvm_archive.JAVA_OPTIONS + " -XX:+UseParallelGC")
    assert jvm_archive.archive_path(a, "jdk 17.0.15") != changed  # other JVM options
    b = _fake_venv(tmp_path / "b", {"spark-core.jar": 10, "spark-sql.jar": 21})
    assert jvm_archive.archive_path(b, "jdk 17.0.15") not in (first, changed)  # another installation


def test_a_driver_gets_the_archive_only_when_it_exists(tmp_path):
    archive = tmp_path / "spark-x.jsa"
    assert jvm_archive.submit_options(None) == ""
    assert jvm_archive.submit_options(archive) == ""
    archive.write_bytes(b"\0")
    opts = jvm_archive.submit_options(archive).split()
    assert f"-XX:SharedArchiveFile={archive}" in opts and "-Xshare:auto" in opts
    assert "-Xlog:cds=off" in opts  # a mismatch is silent: the JVM loads its classes as usual


def test_no_pyspark_no_archive(tmp_path):
    (tmp_path / "bin").mkdir()
    assert jvm_archive.archive_path(tmp_path / "bin" / "python", "jdk") is None


def test_the_cache_keeps_the_archives_used_last(tmp_path):
    import os

    for i in range(5):
        (tmp_path / f"spark-{i}.jsa").write_bytes(b"\0")
        (tmp_path / f"spark-{i}.log").write_text("")
        os.utime(tmp_path / f"spark-{i}.jsa", (1000 + i, 1000 + i))
    os.utime(tmp_path / "spark-0.jsa", (2000, 2000))  # the oldest, used again
    jvm_archive._prune(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spark-0.jsa", "spark-0.log", "spark-4.jsa", "spark-4.log"]
