"""Repository-wide rules: layering, CI entry point, README figures."""

import ast
import functools
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


# -- the layers, computed from the real imports ------------------------------------------------------

#: The layers from the bottom up; each names its units (a package or a module, matched by the longest
#: prefix). A module may import its own unit and any unit of a lower layer; another unit of its own
#: layer only where the layer says ``sideways``. Every module of spark_mq must be in some unit.
LAYERS = [
    ("ground", True, ["spark_mq.errors", "spark_mq.options", "spark_mq.workerheap"]),
    ("protocol", False, ["spark_mq.protocol.amqp08", "spark_mq.protocol.stomp10", "spark_mq.protocol.malamute",
                         "spark_mq.protocol.zmtp", "spark_mq.protocol"]),
    ("transport", False, ["spark_mq.transport"]),
    ("clients", False, ["spark_mq.clients"]),
    ("spark and arrow helpers", True, ["spark_mq.compat", "spark_mq.arrowcols", "spark_mq.schema"]),
    ("sources, sinks, broker", False, ["spark_mq.sources", "spark_mq.sinks", "spark_mq.malamute_broker"]),
    ("formats", True, ["spark_mq.datasources", "spark_mq.registration", "spark_mq"]),
    ("apps", True, ["spark_mq.apps"]),
    ("automatic registration", True, ["pyspark_amqp08", "pyspark_stomp", "pyspark_malamute"]),
]
#: layers below sources and sinks: no Spark, no Arrow (a client or a protocol runs without them)
WITHOUT_SPARK = {"ground", "protocol", "transport", "clients"}
SPARK_PACKAGES = {"pyspark", "pyarrow", "py4j"}
#: (importer, imported): the imports allowed to run up a layer, each inside a module ``__getattr__``
#: only. The DataSource classes moved up to spark_mq.datasources and each format's source pieces to
#: spark_mq.sources.formats; their former public paths (spark_mq.sources.<format>.<Format>DataSource,
#: in docs and notebooks) are compatibility modules that still give them. Nothing in spark_mq imports
#: those (test_no_module_of_the_package_imports_a_compatibility_shim), so they are leaves and no circle.
COMPAT_SHIMS = {(f"spark_mq.sources.{fmt}", "spark_mq.datasources") for fmt in ("amqp08", "stomp", "malamute")}
#: (importer, imported): known exceptions, each with the reason it stays for now
EXCEPTIONS: set = set()  # (importer, imported) pairs allowed against the layers: none


def _python_modules() -> dict:
    """Module name -> path, for spark_mq and the top-level pyspark_* modules."""
    out = {}
    for path in sorted((ROOT / "spark_mq").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    for path in sorted(ROOT.glob("pyspark_*.py")):
        out[path.stem] = path
    return out


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _imports(name: str, path: Path, known: dict) -> list:
    """(imported module, line, inside a module __getattr__) for every import of the file, at any depth
    (function-level imports included), and importlib.import_module calls with a literal name."""
    tree = _tree(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    in_getattr = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and node in tree.body:
            in_getattr.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        out.extend((t, node.lineno, id(node) in in_getattr) for t in targets)
    return out


def _unit_of(name: str):
    """(layer index, layer name, sideways, unit) of the longest unit that ``name`` is in, or None."""
    best = None
    for index, (layer, sideways, units) in enumerate(LAYERS):
        for unit in units:
            if (name == unit or name.startswith(unit + ".")) and (best is None or len(unit) > len(best[3])):
                best = (index, layer, sideways, unit)
    return best


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def layering_violations(modules: dict, only=None) -> list:
    """Every import that breaks the layers (of the modules in ``only``, default all), as text; an empty
    list when the house keeps its shape."""
    problems = []
    for name, path in modules.items():
        if only is not None and name not in only:
            continue
        where = _unit_of(name)
        if where is None:
            problems.append(f"{name} is in no layer: add its unit to LAYERS")
            continue
        index, layer, sideways, unit = where
        for target, line, in_getattr in _imports(name, path, modules):
            at = f"{_shown(path)}:{line}"
            top = target.split(".")[0]
            if top in SPARK_PACKAGES and layer in WITHOUT_SPARK:
                problems.append(f"{at}: {name} ({layer}) imports {target}: no Spark or Arrow below sources/sinks")
            if target not in modules:
                continue  # the standard library or a third party
            other = _unit_of(target)
            if (name, target) in EXCEPTIONS or ((name, target) in COMPAT_SHIMS and in_getattr):
                continue
            if other[0] > index:
                problems.append(f"{at}: {name} ({layer}) imports {target} ({other[1]}): an import up a layer")
            elif other[0] == index and other[3] != unit and not sideways:
                problems.append(f"{at}: {name} imports {target}: {unit} and {other[3]} share the layer "
                                f"{layer!r}, which allows no imports between its units")
    return problems


def import_cycles(modules: dict) -> list:
    """The module cycles (each a sorted list of names), counting function-level imports and the
    compatibility shims' imports (leaves: nothing imports them, so they close no cycle)."""
    graph = {name: sorted({t for t, _, _ in _imports(name, path, modules) if t in modules and t != name})
             for name, path in modules.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_every_import_runs_down_the_layers():
    """protocol -> transport -> clients -> sources, sinks, broker -> datasources -> apps: each layer
    imports only the layers below it (and, where allowed, the other units of its own); no pyspark or
    pyarrow below sources/sinks; the protocols import none of each other."""
    assert layering_violations(_python_modules()) == []


def test_no_import_cycles_between_modules():
    assert import_cycles(_python_modules()) == []


def shim_importers(modules: dict) -> list:
    """Every import, by a module of ``modules``, of a compatibility shim (an importer in COMPAT_SHIMS),
    as text: the shims are for users' code only."""
    shims = {importer for importer, _ in COMPAT_SHIMS}
    return [f"{_shown(path)}:{line}: {name} imports the compatibility shim {target}"
            for name, path in modules.items()
            for target, line, _ in _imports(name, path, modules) if target in shims and target != name]


def test_no_module_of_the_package_imports_a_compatibility_shim():
    """The shims (spark_mq.sources.<format>) exist and are leaves: no module of spark_mq (nor a
    pyspark_* module) imports one, so the one import each makes up a layer closes no circle."""
    modules = _python_modules()
    assert {importer for importer, _ in COMPAT_SHIMS} <= set(modules)
    assert all(target in modules for _, target in COMPAT_SHIMS)
    assert shim_importers(modules) == []


def test_the_shim_rule_catches_an_import_of_a_shim(tmp_path):
    modules = _python_modules()
    for name, text in {"spark_mq.sources.uses_shim": "from spark_mq.sources import stomp\n",
                       "spark_mq.apps.uses_shim": "def f():\n    import spark_mq.sources.malamute\n"}.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        modules[name] = path
    found = "\n".join(shim_importers(modules))
    assert "spark_mq.sources.uses_shim imports the compatibility shim spark_mq.sources.stomp" in found
    assert "spark_mq.apps.uses_shim imports the compatibility shim spark_mq.sources.malamute" in found


def test_the_layering_rules_catch_a_violation(tmp_path):
    """The rules fail on a bad import: a client that imports a source and pyspark, a protocol that
    imports another protocol, a sink that imports a source, and a cycle hidden in a function."""
    modules = _python_modules()
    bad = {
        "spark_mq.clients.bad": "from spark_mq.sources.base import gather\nimport pyspark\n",
        "spark_mq.protocol.stomp10.bad": "def f():\n    from spark_mq.protocol.amqp08 import spec\n",
        "spark_mq.sinks.bad": "from spark_mq.sources import ingest\n",
        "spark_mq.sources.loop_a": "def f():\n    from spark_mq.sources import loop_b\n",
        "spark_mq.sources.loop_b": "from spark_mq.sources.loop_a import f\n",
    }
    for name, text in bad.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        modules[name] = path
    problems = "\n".join(layering_violations(modules, only=bad))
    assert "spark_mq.clients.bad (clients) imports spark_mq.sources.base" in problems
    assert "spark_mq.clients.bad (clients) imports pyspark" in problems
    assert "spark_mq.protocol.stomp10.bad imports spark_mq.protocol.amqp08.spec" in problems
    assert "spark_mq.sinks.bad imports spark_mq.sources.ingest" in problems
    assert ["spark_mq.sources.loop_a", "spark_mq.sources.loop_b"] in import_cycles(modules)


#: a hand-written module may have about this many lines; past it, its docstring says why
MODULE_LINES = 560
GENERATED_MARK = "GENERATED by"


def oversized_modules(modules: dict) -> list:
    """Hand-written modules over MODULE_LINES lines whose docstring gives no reason (a paragraph
    starting "Over 500 lines" or "Above 500 lines"); generated modules (marked so) are exempt."""
    out = []
    for name, path in sorted(modules.items()):
        text = path.read_text()
        lines = text.count("\n")
        doc = ast.get_docstring(ast.parse(text)) or ""
        if lines > MODULE_LINES and GENERATED_MARK not in doc and not any(
                para.lstrip().startswith(("Over 500 lines", "Above 500 lines")) for para in doc.split("\n\n")):
            out.append(f"{name}: {lines} lines and no stated reason in its docstring")
    return out


def test_no_hand_written_module_is_large_without_a_stated_reason():
    """Modules split along their seams: past about 500 lines a module says why it is one piece."""
    assert oversized_modules(_python_modules()) == []


def test_the_size_rule_catches_a_large_module(tmp_path):
    big, reasoned, generated = (tmp_path / f"{n}.py" for n in ("big", "reasoned", "generated"))
    body = "x = 1\n" * (MODULE_LINES + 1)
    big.write_text('"""A module."""\n' + body)
    reasoned.write_text('"""A module.\n\nOver 500 lines on purpose: one state machine."""\n' + body)
    generated.write_text('"""Tables.\n\nGENERATED by a tool."""\n' + body)
    found = oversized_modules({"m.big": big, "m.reasoned": reasoned, "m.generated": generated})
    assert found == [f"m.big: {MODULE_LINES + 2} lines and no stated reason in its docstring"]


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
