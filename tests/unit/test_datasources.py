"""The DataSource classes live in spark_mq.datasources; their former public paths still give them."""

import importlib

import pytest

from spark_mq import datasources
from spark_mq.registration import FORMATS, data_source_class


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_former_path_gives_the_class_of_spark_mq_datasources(fmt):
    _, class_name = FORMATS[fmt]
    cls = data_source_class(fmt)
    assert cls is getattr(datasources, class_name) and cls.name() == fmt
    old = importlib.import_module(f"spark_mq.sources.{fmt}")
    assert getattr(old, class_name) is cls
    assert cls.SOURCE is old and cls.SINK is importlib.import_module(f"spark_mq.sinks.{fmt}")
    with pytest.raises(AttributeError):
        getattr(old, "NoSuchName")
