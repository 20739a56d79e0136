"""Pieces of memest's model description in the proto JSON mapping (memest.v1.Model), shared by
the tracer and the conformance suite's recorder. No dependencies: the recorder loads this file
on its own under an interpreter where the package is not installed."""
import math


def attr_value(v):
    """memest.v1.AttrValue for a Python value: an int (or bool), a float, a string or a list of
    ints. Non-finite floats are spelled as the proto JSON mapping spells them ("NaN",
    "Infinity"), which the server then refuses by name."""
    if isinstance(v, bool):
        return {"i": int(v)}
    if isinstance(v, int):
        return {"i": v}
    if isinstance(v, float):
        if math.isnan(v):
            return {"f": "NaN"}
        if math.isinf(v):
            return {"f": "Infinity" if v > 0 else "-Infinity"}
        return {"f": v}
    if isinstance(v, str):
        return {"s": v}
    if isinstance(v, (list, tuple)):
        return {"ints": {"values": [int(x) for x in v]}}
    raise TypeError(f"unsupported attribute value {v!r}")
