"""Suite-wide test set-up: markers by directory and a per-test time limit as a safety net.

Responsible for: marking everything under tests/integration/ with `integration`, and giving every test
without its own `@pytest.mark.timeout(...)` a generous default limit (pytest-timeout, SIGALRM method, so
fixture finalizers still run and brokers are stopped) so that no test can hang CI.
Not responsible for brokers: see tests/integration/conftest.py and tests/integration/brokers.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"
# Spark binds its driver to the first non-loopback interface unless told otherwise: keep test traffic
# on loopback, also when pytest is run directly rather than through ./dev test.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Seconds; a safety net against hangs, not a performance budget. Override per test with
# @pytest.mark.timeout(N), or for a run with SPARK_MQ_TEST_TIMEOUT=N (0 disables) or --timeout=N.
DEFAULT_TEST_TIMEOUT = 600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_timeout_plugin = config.pluginmanager.hasplugin("timeout")
    default_timeout = int(os.environ.get("SPARK_MQ_TEST_TIMEOUT", DEFAULT_TEST_TIMEOUT))
    explicit_cli_timeout = has_timeout_plugin and config.getoption("timeout", None) is not None
    for item in items:
        if INTEGRATION_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)
        if has_timeout_plugin and not explicit_cli_timeout and default_timeout > 0 \
                and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(default_timeout))
