"""``python -m spark_mq.apps.demo``: the demo (the same as ``spark-mq demo``)."""

import sys

from spark_mq.apps.demo.job import main

sys.exit(main())
