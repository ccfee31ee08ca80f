"""The Spark analytics job over a store's files (``spoolmq analytics``).

Extract (``extract``: the files, with explicit ``schemas``), transform (``transform``: pure
functions on DataFrames), load (``job``: Parquet tables and ``summary.json``; ``report``:
charts and ``report.html``). Only the CLI imports this package: it needs pyspark and a JVM.
"""

from spoolmq.analytics.job import analyse, main, run

__all__ = ["analyse", "main", "run"]
