"""The one compiled part of mqd: the Kafka RecordBatch v2 records kernel (mqd/sources/kafka/_rbv2.c).

``optional=True``: without a C compiler the install still succeeds and the Kafka source decodes with
its pure-Python fallback (slower; see mqd/sources/kafka/records_kernel.py). Everything else is in
pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mqd.sources.kafka._rbv2",
            ["mqd/sources/kafka/_rbv2.c"],
            extra_compile_args=["-O2", "-std=c99"],
            optional=True,
        )
    ]
)
