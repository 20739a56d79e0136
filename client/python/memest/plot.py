"""Estimate.plot(): memory by category across a step's phases, and the top layers."""

from memest.results import CATEGORIES, format_bytes

# One fixed colour per category (matplotlib's tab10 / tab20 hues), so plots compare.
COLORS = {
    "parameters": "#1f77b4",
    "gradients": "#ff7f0e",
    "optimizer_state": "#2ca02c",
    "master_and_casts": "#9467bd",
    "activations": "#d62728",
    "temporaries": "#e377c2",
    "inputs": "#8c564b",
    "kv_cache": "#17becf",
    "workspace": "#bcbd22",
    "communication": "#aec7e8",
    "allocator_overhead": "#c7c7c7",
    "cuda_context": "#7f7f7f",
    "nccl": "#393b79",
}

# A capacity more than this many times the tallest bar is not drawn to scale.
OFF_SCALE = 3

_SCALES = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))


def _scale(largest):
    for unit, size in _SCALES:
        if largest >= size:
            return unit, size
    return "B", 1


def _phase_stacks(estimate):
    """{category: [bytes per phase]}: allocated by category, then the allocator overhead up to
    the phase's reserved bytes, the CUDA context and NCCL (a bar's top: what nvidia-smi shows)."""
    context = estimate.breakdown.cuda_context
    stacks = {name: [] for name in CATEGORIES}
    for phase in estimate.phases:
        allocated = phase.by_category.as_dict()
        for name in CATEGORIES:
            stacks[name].append(allocated[name])
        stacks["allocator_overhead"][-1] = max(0, phase.reserved_bytes - sum(allocated.values()))
        stacks["cuda_context"][-1] = context
        stacks["nccl"][-1] = estimate.breakdown.nccl
    return stacks


def plot_estimate(estimate, top_layers=10, figsize=(13, 5.5)):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plot() needs matplotlib: pip install 'memest[plot]'") from None

    figure = Figure(figsize=figsize, layout="constrained")
    grid = figure.add_gridspec(1, 2, width_ratios=(3, 2))
    phases_ax = figure.add_subplot(grid[0, 0])
    layers_ax = figure.add_subplot(grid[0, 1])

    stacks = _phase_stacks(estimate)
    tops = [sum(stacks[name][i] for name in CATEGORIES) for i in range(len(estimate.phases))]
    capacity = estimate.fit.capacity_bytes if estimate.fit is not None else 0
    unit, size = _scale(max(tops + [capacity, 1]))
    names = [p.phase.replace("_", " ") for p in estimate.phases]
    positions = range(len(names))
    bottoms = [0.0] * len(names)
    for name in CATEGORIES:
        values = [v / size for v in stacks[name]]
        if not any(values):
            continue
        phases_ax.bar(positions, values, bottom=bottoms, color=COLORS[name], width=0.65,
                      label=name.replace("_", " "), edgecolor="white", linewidth=0.5)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    phases_ax.set_xticks(list(positions), names)
    phases_ax.set_ylabel("memory (%s)" % unit)
    phases_ax.set_title("Memory by category at each phase's peak")
    phases_ax.grid(axis="y", alpha=0.3)
    phases_ax.set_axisbelow(True)

    for i, phase in enumerate(estimate.phases):
        if phase.phase == estimate.peak.phase:
            phases_ax.annotate(
                "peak: %s allocated\n%s" % (format_bytes(estimate.peak.allocated_bytes),
                                            estimate.peak.where or "in " + phase.phase),
                xy=(i, tops[i] / size), xytext=(0, 14), textcoords="offset points",
                ha="center", va="bottom", fontsize=9, fontweight="bold",
                bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none",
                          alpha=0.85),
                arrowprops=dict(arrowstyle="-|>", color="black"))
            phases_ax.bar([i], [tops[i] / size], width=0.65, fill=False, edgecolor="black",
                          linewidth=2)
    top = max(tops + [1])
    if estimate.fit is not None:
        fit = estimate.fit
        verdict = "fits" if fit.fits else "does NOT fit"
        label = "%s capacity (%s)" % (fit.device, format_bytes(capacity))
        if capacity <= OFF_SCALE * top:
            line = phases_ax.axhline(capacity / size, color="#cf222e", linestyle="--",
                                     linewidth=1.8, label=label)
            line.set_gid("capacity")
            phases_ax.set_ylim(0, max(capacity, top) / size * 1.15)
        else:
            # The device dwarfs the step: keep the bars readable and say where the line is.
            phases_ax.set_ylim(0, top / size * 1.3)
            label += ", far above: off scale"
            phases_ax.plot([], [], color="#cf222e", linestyle="--", linewidth=1.8, label=label)
        phases_ax.text(0.01, 0.99, "%s %s: needs %s, headroom %s" % (
            verdict, fit.device, format_bytes(fit.required_bytes),
            format_bytes(fit.headroom_bytes)), transform=phases_ax.transAxes, va="top",
            fontsize=9, fontweight="bold", color="#1a7f37" if fit.fits else "#cf222e")
    else:
        phases_ax.set_ylim(0, top / size * 1.3)
    # Below the bars, so it never hides one.
    phases_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=4, fontsize=8,
                     frameon=False)

    _plot_layers(layers_ax, estimate, top_layers)
    if estimate.label:
        figure.suptitle(estimate.label)
    return figure


def _plot_layers(ax, estimate, top_layers):
    rows = sorted((row for row in estimate.layers if row.saved_bytes),
                  key=lambda row: row.saved_bytes, reverse=True)[:top_layers]
    ax.set_title("Top %d layers by bytes saved for backward" % top_layers)
    if not rows:
        ax.text(0.5, 0.5, "nothing is saved for backward\n(inference, or no layers)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    unit, size = _scale(rows[0].saved_bytes)
    labels = [row.scope or "(top level)" for row in rows][::-1]
    values = [row.saved_bytes / size for row in rows][::-1]
    bars = ax.barh(range(len(rows)), values, color=COLORS["activations"])
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xlabel("saved for backward (%s)" % unit)
    for bar, row in zip(bars, rows[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                " " + format_bytes(row.saved_bytes), va="center", fontsize=8)
    ax.set_xlim(0, max(values) * 1.25)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
