"""Provides `dense_tensors`: the tensors of one static shape a traced step computes, for the tests
that a sparse gradient (an embedding table's) is never made dense: an `IndexedSlices` turned
into a `[rows, dim]` tensor (`tf.convert_to_tensor`: an `UnsortedSegmentSum` of that shape) and
everything computed from it show up, while the table's own reads (`ReadVariableOp`, the lookup's
gather reads the variable) are the allowed ones."""

from __future__ import annotations

import tensorflow as tf

# The table's own value: its reads, and the resource ops around them.
READS = ("ReadVariableOp", "VarHandleOp", "Placeholder")


def graph_ops(graph):
    """Every op of `graph` and of the functions it calls (while-loop bodies, conditionals),
    each function once."""
    seen, stack = set(), [graph]
    while stack:
        g = stack.pop()
        yield from g.get_operations()
        for name, function in getattr(g, "_functions", {}).items():
            inner = getattr(function, "graph", None)
            if name not in seen and inner is not None:
                seen.add(name)
                stack.append(inner)


def dense_tensors(fn: tf.types.experimental.ConcreteFunction, shape) -> list[str]:
    """'type name' of every op of `fn` (a concrete function) with an output of static `shape`,
    other than the reads (`READS`) and their identities."""
    shape = tf.TensorShape(shape)
    found = []
    for op in graph_ops(fn.graph):
        if op.type in READS:
            continue
        if op.type == "Identity" and op.inputs[0].op.type in READS:
            continue
        if any(o.shape.is_fully_defined() and o.shape == shape for o in op.outputs):
            found.append(f"{op.type} {op.name}")
    return found
