"""The DataSource classes live in spark_mq.datasources and each format's source pieces in
spark_mq.sources.formats; their former public paths (spark_mq.sources.<format>) still give them."""

import importlib

import pytest

from spark_mq import datasources
from spark_mq.registration import FORMATS, data_source_class


def test_the_former_import_statements_give_the_classes_of_spark_mq_datasources():
    from spark_mq.sources.amqp08 import Amqp08DataSource
    from spark_mq.sources.malamute import MalamuteDataSource
    from spark_mq.sources.stomp import StompDataSource

    assert Amqp08DataSource is datasources.Amqp08DataSource
    assert StompDataSource is datasources.StompDataSource
    assert MalamuteDataSource is datasources.MalamuteDataSource


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_former_path_gives_the_class_of_spark_mq_datasources(fmt):
    _, class_name = FORMATS[fmt]
    cls = data_source_class(fmt)
    assert cls is getattr(datasources, class_name) and cls.name() == fmt
    old = importlib.import_module(f"spark_mq.sources.{fmt}")
    assert getattr(old, class_name) is cls
    source = importlib.import_module(f"spark_mq.sources.formats.{fmt}")
    assert cls.SOURCE is source and cls.SINK is importlib.import_module(f"spark_mq.sinks.{fmt}")
    for name in source.__all__:  # the source's other former public names
        assert getattr(old, name) is getattr(source, name)
    with pytest.raises(AttributeError):
        getattr(old, "NoSuchName")
    with pytest.raises(AttributeError):
        getattr(old, "__path__")  # a module, not a package
