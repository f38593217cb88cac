"""How a figure becomes PNG bytes (``analysis.png``) and how ``analysis.plots`` stacks bars: the PNG is
cropped to what is drawn plus ``savefig.pad_inches``, nothing cut off (also where something lies far
outside the figure), and the stacked bars stand where ``Axes.bar`` would put them."""

import io

import numpy as np
import pytest

from memsweep.analysis import plots, png

WHITE = (255, 255, 255)


def _pixels(png: bytes) -> np.ndarray:
    """The PNG's pixels as RGB rows, top first."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def _pad_px() -> int:
    import matplotlib

    return round(matplotlib.rcParams["savefig.pad_inches"] * plots._DPI)


def test_drawn_crops_to_the_pixels_unlike_the_corner_plus_the_pad():
    rgba = np.full((40, 60, 4), 255, np.uint8)
    rgba[10:20, 15:30] = (0, 0, 0, 255)
    crop = png._drawn(rgba, 3)
    assert crop.shape[:2] == (10 + 2 * 3, 15 + 2 * 3)
    assert (crop[3:-3, 3:-3, :3] == 0).all() and (crop[:3] == 255).all() and (crop[:, -3:] == 255).all()


@pytest.mark.parametrize("where", [(0, 30), (39, 30), (20, 0), (20, 59)])
def test_drawn_is_none_where_a_drawn_pixel_touches_the_canvas_edge(where):
    """A pixel on the edge: the canvas may have cut off what lies beyond it."""
    rgba = np.full((40, 60, 4), 255, np.uint8)
    rgba[20, 30] = rgba[where] = (0, 0, 0, 255)
    assert png._drawn(rgba, 3) is None


def test_drawn_is_none_for_a_blank_canvas():
    assert png._drawn(np.full((8, 8, 4), 255, np.uint8), 1) is None


def _border_is_background_with_ink_inside(pixels: np.ndarray, pad: int) -> None:
    """``pad`` rows and columns of background on each side, and something drawn on the next one."""
    for side in (pixels[:pad], pixels[-pad:], pixels[:, :pad], pixels[:, -pad:]):
        assert (side == WHITE).all()
    for line in (pixels[pad], pixels[-pad - 1], pixels[:, pad], pixels[:, -pad - 1]):
        assert (line != WHITE).any()


def test_png_keeps_a_legend_outside_the_figure_drawn_once_and_cropped_to_the_drawing(monkeypatch):
    """The legend lies right of the figure (``bbox_to_anchor`` past the axes), within the canvas's
    room: the figure is drawn once, the PNG is wider than the figure, and it is what is drawn with
    the pad of background around it."""
    draws, draw = [], png._draw
    monkeypatch.setattr(png, "_draw", lambda *a: draws.append(a) or draw(*a))
    fig, ax = plots.pyplot().subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1], label="a line")
    ax.legend(loc="upper left", bbox_to_anchor=(1.05, 1.0))
    pixels = _pixels(plots._png(fig))
    assert len(draws) == 1
    assert pixels.shape[1] > 3 * plots._DPI
    _border_is_background_with_ink_inside(pixels, _pad_px())


@pytest.mark.parametrize("far", [0.5, 1 + 2 * png.ROOM])  # inches past the canvas: partly, wholly
def test_png_draws_a_text_beyond_the_canvas_at_the_tight_box(far):
    """A text starting right of the canvas's edge (partly off it, or wholly): in the PNG all the
    same (drawn at matplotlib's tight box), with background at the very edge of the PNG."""
    fig, ax = plots.pyplot().subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    at = 2 + png.ROOM + far - 0.6  # inches from the figure's left edge
    fig.text(at / 2, 0.5, "far away", fontsize=20)  # figure fraction
    pixels = _pixels(plots._png(fig))
    assert pixels.shape[1] > (at + 0.6) * plots._DPI
    for edge in (pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]):
        assert (edge == WHITE).all()
    assert (pixels[:, -_pad_px() - 2 :] != WHITE).any(), "the text reaches the right end, but for the pad"


def test_png_is_rgb_where_opaque_and_rgba_where_not():
    from PIL import Image

    def mode(transparent: bool) -> str:
        fig, ax = plots.pyplot().subplots(figsize=(2, 2))
        ax.plot([0, 1], [0, 1])
        if transparent:
            fig.patch.set_alpha(0.0)
            ax.patch.set_alpha(0.0)
        return Image.open(io.BytesIO(plots._png(fig))).mode

    assert mode(False) == "RGB"
    assert mode(True) == "RGBA"


def test_stacked_bars_stand_where_axes_bar_puts_them():
    """The same layers by ``_stacked_bars`` and by ``Axes.bar`` with ``bottom``: the same rectangles,
    the same tops and the same autoscaled limits (the y axis from 0)."""
    plt = plots.pyplot()
    xs, layers = [0, 1, 2], [[1.0, 0.0, 2.0], [0.5, 3.0, 0.0]]
    fig, ax = plt.subplots()
    bars = plots._stacked_bars(ax, xs, layers, 0.6, ["C0", "C1"], ["a", "b"])
    ours = [coll.get_paths() for coll in bars.handles]
    ref_fig, ref = plt.subplots()
    bottom = np.zeros(3)
    theirs = []
    for heights in layers:
        theirs.append(ref.bar(xs, heights, bottom=bottom, width=0.6).patches)
        bottom = bottom + heights
    for paths, patches in zip(ours, theirs):
        for path, patch in zip(paths, patches):
            corners = patch.get_bbox().get_points()
            assert np.allclose(path.get_extents().get_points(), corners)
    assert bars.tops == bottom.tolist() == [1.5, 3.0, 2.0]
    ax.autoscale_view()
    ref.autoscale_view()
    assert np.allclose(ax.get_ylim(), ref.get_ylim()) and ax.get_ylim()[0] == 0
    assert np.allclose(ax.get_xlim(), ref.get_xlim())
    assert [h.get_label() for h in bars.handles] == ["a", "b"]
    plt.close(fig)
    plt.close(ref_fig)


def test_phases_plot_legend_names_the_capacity_then_each_phase(monkeypatch):
    """The legend as when the bars were ``Axes.bar`` containers: the capacity line, then the phases
    in order, each box in its layer's colour."""
    seen, save = [], plots._png
    monkeypatch.setattr(plots, "_png", lambda fig: seen.append(fig) or save(fig))
    png = plots.phases_plot("batch", [1, 2], ["load", "step"], [[1, 2], [3, None]], ["ok", "oom"], 8, "c")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = seen[0].axes
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["capacity", "load", "step"]
    for handle, coll in zip(legend.legend_handles[1:], ax.collections):
        assert np.allclose(handle.get_facecolor(), coll.get_facecolor()[0])


def test_cards_plot_draws_a_white_line_between_each_two_cells(monkeypatch):
    """Two line collections: one vertical line between each two columns, one horizontal line
    between each two rows, each across the whole grid."""
    seen, save = [], plots._png
    monkeypatch.setattr(plots, "_png", lambda fig: seen.append(fig) or save(fig))
    status = [["fits", "tight", "no"], ["fits", "fits", "tight"]]
    plots.cards_plot(["small", "large"], [1, 2, 4], status, "batch", "cards")
    (ax,) = seen[0].axes
    vertical, horizontal = (c.get_segments() for c in ax.collections)
    assert sorted(s[0][0] for s in vertical) == [0.5, 1.5]
    assert [s[0][1] for s in horizontal] == [0.5]
    assert all((s[0][1], s[1][1]) == (-0.5, 1.5) for s in vertical)
    assert all((s[0][0], s[1][0]) == (-0.5, 2.5) for s in horizontal)
