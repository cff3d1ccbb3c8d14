"""Build the distributables: a wheel (``pip install``) and a zip for ``spark-submit --py-files``.

Responsible for: copying the package sources to a scratch directory (so the build leaves no
``build/`` or ``*.egg-info`` behind in the working tree), building the wheel there with
``pip wheel --no-deps``, and writing ``spark_mq-<version>-py-files.zip`` with the ``spark_mq``
package and the ``pyspark_<format>`` modules (sources only, sorted entries, fixed timestamps:
the same tree gives the same zip). ``./dev dist`` runs it; the packaging tests call ``build()``.

    python scripts/build_dist.py [--out dist] [--no-wheel] [--no-zip]

The zip holds pure Python only. Its runtime dependencies must be installed where it runs:
pyarrow (every Spark 4 image has it) and, for the malamute format only, pyzmq (a compiled
extension cannot be imported from a zip).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_MODULES = ("pyspark_amqp08.py", "pyspark_stomp.py", "pyspark_malamute.py")
PACKAGE = "spark_mq"
PROJECT_FILES = ("pyproject.toml", "README.md", "LICENSE")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def version(root: Path = ROOT) -> str:
    with open(root / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]["version"]


def _sources(root: Path) -> list:
    """Relative paths of every file that goes into the zip, sorted."""
    files = [root / m for m in TOP_MODULES]
    files += [p for p in (root / PACKAGE).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(p.relative_to(root) for p in files)


def build_zip(out: Path, root: Path = ROOT) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"spark_mq-{version(root)}-py-files.zip"
    tmp = path.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for rel in _sources(root):
            info = zipfile.ZipInfo(rel.as_posix(), _ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, (root / rel).read_bytes())
    tmp.replace(path)
    return path


def build_wheel(out: Path, root: Path = ROOT, python: str = sys.executable) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spark-mq-build-") as scratch:
        src = Path(scratch) / "src"
        src.mkdir()
        for name in PROJECT_FILES + TOP_MODULES:
            if (root / name).exists():
                shutil.copy2(root / name, src / name)
        shutil.copytree(root / PACKAGE, src / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        wheels = Path(scratch) / "wheels"
        subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)],
                       check=True, stdin=subprocess.DEVNULL)
        built = sorted(wheels.glob("*.whl"))
        if len(built) != 1:
            raise RuntimeError(f"expected one wheel, got {built}")
        target = out / built[0].name
        shutil.copy2(built[0], target)
    return target


def build(out: Path, wheel: bool = True, zip_: bool = True, root: Path = ROOT) -> dict:
    result = {}
    if wheel:
        result["wheel"] = build_wheel(out, root)
    if zip_:
        result["zip"] = build_zip(out, root)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="build the spark-mq wheel and --py-files zip")
    p.add_argument("--out", default=str(ROOT / "dist"), help="output directory (default: dist/)")
    p.add_argument("--no-wheel", action="store_true")
    p.add_argument("--no-zip", action="store_true")
    args = p.parse_args(argv)
    for kind, path in build(Path(args.out), not args.no_wheel, not args.no_zip).items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
