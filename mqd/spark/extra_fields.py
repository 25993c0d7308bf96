"""A JSON object's top-level fields that its schema does not name, kept as JSON in ``_extra``.

Both JSON paths have such fields: JSON mode's ``spark.value_schema`` names some of the value's
fields, and a JSON Schema (whose ``additionalProperties`` is true unless it says otherwise) lets a
producer send properties it does not declare. Neither drops them: the row keeps them as one JSON
object, and the rows that have any are counted (the batch's ``extra_field_rows``,
``mqd_spark_extra_field_rows_total``).
"""

from __future__ import annotations

from typing import Any

EXTRA_COLUMN = "_extra"


def extra_fields(text: Any, known: list[str]) -> Any:
    """The fields of the JSON object ``text`` (a string column) not in ``known``, as a JSON object
    with their values as they were (numbers, strings, objects); null when there are none. The text
    is parsed a second time only for records that have such fields."""
    from pyspark.sql import functions as F

    names = F.array(*[F.lit(n) for n in known]) if known else F.array().cast("array<string>")
    unknown = F.array_except(F.json_object_keys(text), names)
    fields = F.from_json(text, "map<string, variant>")
    return F.when(
        F.size(unknown) > 0, F.to_json(F.map_filter(fields, lambda k, _v: ~F.array_contains(names, k)))
    )


__all__ = ["EXTRA_COLUMN", "extra_fields"]
