"""Carry each source record's position through the user's transform.

The prepare hands the transform the source with the :data:`~.source.PROVENANCE_COLUMN`
struct (topic, partition, offset). Most transforms drop it without meaning to: a
``select("key", udf("value"))`` (the usual shape of a transform) keeps only what it names.
Without it the staged records name no source record, and the audit could only count them.

Where the transform's operators keep every output row derived from one source row (a
projection, a filter, a Python or pandas UDF, an ``explode``, a join with static data while
the frame still has the column, a repartition, a sort, a window, a
``dropDuplicates``/``distinct``, which keeps its first row's position and drops the rest),
the column is put back: Spark's analyzer is asked to resolve the source's own provenance
attribute on top of the transform's output, which it does by adding the attribute to every
operator between the two (its rule for a filter that names a column its child dropped,
``ResolveMissingReferences``). The rows are the same rows, computed by the same plan: only
one more column is kept. The plan is walked first and Spark is asked only when every
operator on the way passes its child's columns through (:data:`_PASSING`): a failed
analysis of a plan holding an observation (the source's range counts) fails that
observation too.

Elsewhere (an aggregation, a union, ``mapInPandas``, a join after a select that dropped
the column) the output carries no source position: the prepare counts it as such
(never as records dropped by the transform) and ``eo audit`` says its source records were
checked by count only.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from airflow_provider_eo.spark.shape import passed_through
from airflow_provider_eo.spark.source import PROVENANCE_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["carry_provenance"]


def carry_provenance(out: DataFrame, source: DataFrame) -> DataFrame:
    """``out`` (the transform's output over ``source``) with ``source``'s
    :data:`~.source.PROVENANCE_COLUMN` added as its last column when the transform dropped
    it and every operator in between can pass it through; else ``out`` unchanged.

    ``out`` is returned as it is when it has a column of that name already (kept, or the
    transform's own), when Spark cannot carry the column (see the module docstring) and for
    a DataFrame without a py4j plan.
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import functions as F

    if PROVENANCE_COLUMN in out.columns:
        return out
    try:
        if not _can_carry(out._jdf.queryExecution().analyzed(), _attribute(source)):
            return out
        # The source's attribute itself (its expression id), not a column by name: resolved
        # on top of `out`, Spark passes it up from where the source made it.
        wanted = source[PROVENANCE_COLUMN]
        probe = out.where(wanted.isNotNull() | F.lit(True))._jdf.queryExecution().analyzed()
        # Spark's answer: Project(out's columns, Filter(cond, <out's plan keeping the column>)).
        if probe.nodeName() != "Project" or probe.child().nodeName() != "Filter":
            return out
        session = out.sparkSession
        jvm: Any = session._jvm
        plan = probe.child().child()
        carried = SparkDataFrame(
            jvm.org.apache.spark.sql.classic.Dataset.ofRows(session._jsparkSession, plan), session
        )
    except AnalysisException:  # an operator that cannot pass the column through
        return out
    except Exception:  # not a classic (py4j) DataFrame
        return out
    return carried if passed_through(carried, source, PROVENANCE_COLUMN) else out


# Operators whose output holds their child's every column and whose every output row is
# one of their child's rows (Spark's analyzer passes a missing column through them).
_PASSING = frozenset(
    {
        "Project",
        "Filter",
        "Generate",
        "SubqueryAlias",
        "Sort",
        "Repartition",
        "RepartitionByExpression",
        "RebalancePartitions",
        "Window",
        "Sample",
        "LocalLimit",
        "GlobalLimit",
        "Offset",
        "Deduplicate",
        "ResolvedHint",
        "CollectMetrics",
    }
)


def _attribute(source: DataFrame) -> str:
    """The provenance attribute of ``source``'s analyzed plan, as Spark prints it
    (``_eo_src#<expression id>``)."""
    text = str(source._jdf.queryExecution().analyzed().outputSet().toString())
    found = re.search(rf"(?:^|[{{\s,])({re.escape(PROVENANCE_COLUMN)}#\d+)\b", text)
    if found is None:
        raise ValueError(f"no {PROVENANCE_COLUMN} in the source's output")
    return found.group(1)


def _can_carry(plan: Any, attribute: str) -> bool:
    """Whether ``attribute`` reaches the top of ``plan`` when added to every operator
    between the top and the first one that outputs it: only through :data:`_PASSING`
    operators (one child each). Checked before Spark is asked: an analysis that fails on a
    plan with an observation (the source's range counts) fails that observation too."""
    node = plan
    pattern = re.compile(rf"(?:^|[{{\s,]){re.escape(attribute)}\b")
    while not pattern.search(str(node.outputSet().toString())):
        if node.nodeName() not in _PASSING or node.children().size() != 1:
            return False
        node = node.children().apply(0)
    return True
