"""The Spark version matrix: which pyspark releases spark-mq is tested on, and what each offers.

One definition for three users: ``./dev`` makes one virtual environment per release
(``python scripts/spark_matrix.py venvs``), the matrix test (tests/integration/test_spark_versions.py)
runs the end-to-end job on each and checks that the capabilities ``spark_mq.compat`` detects, and the
behaviour that follows from them, are the ones stated here, and scripts/gen_docs.py renders the
compatibility table of the README and docs/getting-started.md from it (a freshness test keeps them equal).

    python scripts/spark_matrix.py venvs     # create or refresh .venv-spark-<minor>/ for every release
    python scripts/spark_matrix.py list      # the releases and their venvs

Standard library only: it runs before the project's virtual environment exists.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Release:
    version: str                 # the pyspark release installed from the package index
    platforms: Tuple[str, ...]   # managed platforms whose runtime carries this Spark minor
    read_limits: bool            # latestOffset(start, limit), getDefaultReadLimit, reportLatestOffset
    available_now: bool          # SupportsTriggerAvailableNow: availableNow runs many batches
    stream_arrow_writer: bool    # DataSourceStreamArrowWriter: the streaming sink gets Arrow batches
    newest: bool = False         # the main virtual environment's release: the whole suite runs on it

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    def capabilities(self) -> dict:
        """What ``python -m spark_mq.compat`` must print on this release."""
        return {"pyspark_version": self.version, "read_limits": self.read_limits,
                "available_now": self.available_now, "stream_arrow_writer": self.stream_arrow_writer}


#: The latest patch of every Spark 4 minor. Databricks runtimes from the Databricks release notes;
#: EMR is not listed: no EMR release with Spark 4 was verified here.
RELEASES = (
    Release("4.0.5", ("Databricks Runtime 17.3 LTS (Spark 4.0.0)",), read_limits=False, available_now=False,
            stream_arrow_writer=False),
    Release("4.1.4", ("Databricks Runtime 18 LTS (Spark 4.1.0)",), read_limits=False, available_now=False,
            stream_arrow_writer=True),
    Release("4.2.1", ("Databricks Runtime 19 (Spark 4.2.0)",), read_limits=True, available_now=True,
            stream_arrow_writer=True),
    Release("4.3.0", (), read_limits=True, available_now=True, stream_arrow_writer=True, newest=True),
)

#: Checkpoint upgrades the matrix tests: a query killed mid-run on the first is continued on the second.
UPGRADES = (("4.0.5", "4.1.4"), ("4.2.1", "4.3.0"))

#: Everything a matrix venv needs besides the wheel (pyspark's own pin is added per release).
VENV_REQUIREMENTS = ("pyarrow>=15", "pyzmq>=25", "numpy>=1.21", "pandas>=2.2,<3")


def lanes() -> list:
    """The releases in runs that must go in order: an upgrade pair is one lane (older, then newer);
    every other release a lane of its own. Lanes may run side by side."""
    out, placed = [], set()
    for older, newer in UPGRADES:
        out.append([older, newer])
        placed.update((older, newer))
    out += [[r.version] for r in RELEASES if r.version not in placed]
    return out


def release(version: str) -> Release:
    for r in RELEASES:
        if r.version == version:
            return r
    raise KeyError(version)


def venv_dir(r: Release, root: Path = ROOT) -> Path:
    """Where ``r``'s virtual environment lives (the newest release uses the main ``.venv``)."""
    if r.newest:
        return Path(os.environ.get("SPARK_MQ_VENV", root / ".venv"))
    return root / f".venv-spark-{r.minor}"


def python_of(r: Release, root: Path = ROOT) -> Path:
    return venv_dir(r, root) / "bin" / "python"


def _stamp(r: Release) -> str:
    return f"pyspark[connect]=={r.version} " + " ".join(VENV_REQUIREMENTS)


def ensure_venv(r: Release, root: Path = ROOT, log=print) -> Optional[Path]:
    """Create (or refresh, when its requirements changed) ``r``'s venv; returns its python. The
    newest release is the main venv, made by ``./dev`` itself."""
    if r.newest:
        return python_of(r, root)
    venv = venv_dir(r, root)
    stamp = venv / ".spark-mq-matrix"
    if stamp.exists() and stamp.read_text() == _stamp(r) and python_of(r, root).exists():
        return python_of(r, root)
    log(f"[spark-mq] creating {venv.name} (pyspark {r.version}; log: {venv}/pip-install.log)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, stdin=subprocess.DEVNULL)
    with open(venv / "pip-install.log", "w") as out:
        done = subprocess.run([str(python_of(r, root)), "-m", "pip", "install", "-q", f"pyspark[connect]=={r.version}",
                               *VENV_REQUIREMENTS], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = (venv / "pip-install.log").read_text()[-3000:]
        raise RuntimeError(f"pip could not install pyspark {r.version} into {venv}:\n{tail}")
    stamp.write_text(_stamp(r))
    return python_of(r, root)


def main(argv) -> int:
    verb = argv[0] if argv else "list"
    if verb == "venvs":
        for r in RELEASES:
            ensure_venv(r, log=lambda m: print(m, file=sys.stderr))
        return 0
    if verb == "list":
        for r in RELEASES:
            print(r.version, venv_dir(r))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
