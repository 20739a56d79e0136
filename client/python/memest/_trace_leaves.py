"""The module and inputs a trace runs on.

`_module_on_meta(m)`: `m` moved to the meta device with its tied weights still tied. nn.Module.to
replaces each module's parameters one module at a time (a new Parameter per module when the
device changes), so a weight that two modules share (GPT-2's lm_head.weight and
transformer.wte.weight, one Parameter) would come back as two: the trace would declare it twice.
Every holder of one tensor gets the same meta tensor back.
"""


def _module_on_meta(m):
    holders = {}  # id(tensor) -> [(module, kind, name)], kind "_parameters" or "_buffers"
    for mod in m.modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in getattr(mod, kind).items():
                if t is not None:
                    holders.setdefault(id(t), []).append((mod, kind, name))
    m = m.to("meta")
    for group in holders.values():
        if len(group) < 2:
            continue
        mod, kind, name = group[0]
        shared = getattr(mod, kind)[name]
        for mod, kind, name in group[1:]:
            getattr(mod, kind)[name] = shared
    return m
