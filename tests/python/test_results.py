"""Results: dataframes, reprs and the plot."""

import matplotlib.figure
import pytest

import memest
from memest.results import CATEGORIES


def test_format_bytes():
    assert memest.format_bytes(0) == "0 B"
    assert memest.format_bytes(1023) == "1023 B"
    assert memest.format_bytes(1024) == "1.00 KiB"
    assert memest.format_bytes(510342144) == "487 MiB"
    assert memest.format_bytes(2529757184) == "2.36 GiB"
    assert memest.format_bytes(-(3 << 30)) == "-3.00 GiB"


def test_categories_dataframe(gpt2):
    frame = gpt2.to_dataframe()
    assert frame.shape == (len(CATEGORIES), 2)
    assert list(frame.index) == list(CATEGORIES)
    assert list(frame.columns) == ["bytes", "share"]
    assert frame["bytes"].sum() == gpt2.breakdown.total
    assert frame["share"].sum() == pytest.approx(1.0)
    assert str(frame["bytes"].dtype) == "int64"


def test_phases_dataframe(gpt2):
    frame = gpt2.to_dataframe("phases")
    assert frame.shape == (5, len(CATEGORIES) + 4)
    assert list(frame.index) == ["data", "forward", "loss", "backward", "optimizer_step"]
    peak = frame.loc[gpt2.peak.phase]
    assert peak["allocated_bytes"] == gpt2.peak.allocated_bytes
    assert peak["parameters"] == gpt2.breakdown.parameters


def test_layers_dataframe(gpt2):
    frame = gpt2.to_dataframe("layers")
    assert frame.shape == (len(gpt2.layers), 4)
    assert frame.index.name == "scope"
    assert frame["parameter_bytes"].sum() > 0
    with pytest.raises(ValueError, match="table"):
        gpt2.to_dataframe("nope")


def test_repr_names_the_peak_phase_and_the_fit(gpt2):
    text = repr(gpt2)
    assert text.startswith("<memest.Estimate gpt2-small seq=128, batch 2")
    assert "in " + gpt2.peak.phase in text
    assert memest.format_bytes(gpt2.peak.allocated_bytes) + " allocated" in text
    assert "fits a100-80gb" in text
    html = gpt2._repr_html_()
    assert "<table>" in html and gpt2.peak.phase in html and "fits a100-80gb" in html


def test_plot_draws_the_capacity_line(client, tmp_path):
    # A 4 GiB card: the line is on the same scale as the bars.
    result = client.estimate(preset="gpt2-small", batch_size=2, seq=128, capacity_bytes="4GiB")
    figure = result.plot()
    assert isinstance(figure, matplotlib.figure.Figure)
    phases_ax, layers_ax = figure.axes[:2]
    capacity = [line for line in phases_ax.get_lines() if line.get_gid() == "capacity"]
    assert len(capacity) == 1
    unit_bytes = 1 << 30  # the axis is in GiB for a 4 GiB card
    assert capacity[0].get_ydata()[0] * unit_bytes == pytest.approx(result.fit.capacity_bytes)
    assert [t.get_text() for t in phases_ax.get_xticklabels()] == [
        "data", "forward", "loss", "backward", "optimizer step"]
    assert any("peak" in t.get_text() for t in phases_ax.texts)
    assert len(layers_ax.patches) == 10
    path = tmp_path / "gpt2.png"
    figure.savefig(path, dpi=60)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_large_device_and_of_inference(gpt2, client):
    figure = gpt2.plot(top_layers=5)
    phases_ax, layers_ax = figure.axes[:2]
    assert not [line for line in phases_ax.get_lines() if line.get_gid() == "capacity"]
    assert "off scale" in " ".join(t.get_text() for t in phases_ax.get_legend().get_texts())
    assert len(layers_ax.patches) == 5
    inference = client.estimate(preset="gpt2-small", seq=128, mode="inference", advice=False)
    figure = inference.plot()
    assert "nothing is saved" in figure.axes[1].texts[0].get_text()
