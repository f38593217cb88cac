"""A matplotlib figure as PNG bytes, cropped to what it draws, drawn once.

matplotlib's ``bbox_inches="tight"`` measures every text of a figure (its tight box) and then draws
it, measuring every text again on the renderer of the cropped size. Here the figure is drawn once,
on a canvas ``ROOM`` inches larger than the figure on every side, and the pixels are cropped to
those drawn; the figure is drawn a second time, at matplotlib's tight box, only where the canvas
may have cut something off. Needs matplotlib's Agg canvas and Pillow (matplotlib's own dependency).
"""

from __future__ import annotations

import io

import matplotlib
import numpy as np

ROOM = 2.5
"""Inches of canvas around the figure (legends and labels beside the axes lie outside the figure)."""

COMPRESS_LEVEL = 3
"""zlib's level for the PNGs (Pillow's ``compress_level``; its default is 6): about a third less CPU
to encode a report's figures, for 0.2 % more bytes (their flat colours compress alike)."""


def figure_png(fig, dpi: float) -> bytes:
    """``fig`` as PNG bytes at ``dpi``, cropped to what it draws plus ``savefig.pad_inches``.

    Drawn once on a canvas ``ROOM`` inches larger than the figure on every side and cropped to its
    drawn pixels (those unlike the canvas's corner), plus the pad. Drawn again at matplotlib's
    padded tight box (``bbox_inches="tight"``) instead where a drawn pixel lies on the canvas's edge
    or where an axes, a legend or a text lies partly off the canvas (seen as the figure is drawn):
    what lies beyond the canvas is then in the PNG too.

    Args:
        fig: a figure on matplotlib's Agg canvas (pyplot's, with the Agg backend).
        dpi: pixels per inch.

    Returns:
        The PNG bytes (RGB where every pixel is opaque, else RGBA).
    """
    from matplotlib.transforms import Bbox

    pad = matplotlib.rcParams["savefig.pad_inches"]
    width, height = fig.get_size_inches()
    room = Bbox.from_extents(-ROOM, -ROOM, width + ROOM, height + ROOM)
    rgba, placed = _draw(fig, room, dpi)
    canvas = Bbox.from_bounds(0, 0, rgba.shape[1], rgba.shape[0])
    crop = _drawn(rgba, round(pad * dpi)) if all(_within(box, canvas) for box in placed) else None
    if crop is None:
        tight = fig.get_tightbbox(fig.canvas.get_renderer())
        crop, _ = _draw(fig, tight.padded(pad, pad), dpi)
    return _encode(crop, dpi)


def _draw(fig, box, dpi: float) -> tuple[np.ndarray, list]:
    """``fig`` drawn on a canvas of ``box`` (inches, figure coordinates): its RGBA pixels (rows top
    first) and the boxes (canvas pixels, as drawn) of what ``_placed`` names."""
    placed: list = []
    sizes: list[tuple[int, int]] = []

    def seen(event) -> None:
        placed.extend(_placed(fig, event.renderer))
        sizes.append((int(event.renderer.height), int(event.renderer.width)))

    watch = fig.canvas.mpl_connect("draw_event", seen)
    raw = io.BytesIO()
    try:
        fig.savefig(raw, format="rgba", dpi=dpi, bbox_inches=box)
    finally:
        fig.canvas.mpl_disconnect(watch)
    return np.frombuffer(raw.getbuffer(), np.uint8).reshape(*sizes[-1], 4), placed


def _placed(fig, renderer) -> list:
    """Display boxes of what may lie anywhere, measured as ``fig`` is drawn (its texts' layouts
    already made on ``renderer``): each axes, each legend (its frame, placed by its draw) and each
    text of the figure or an axes (titles, annotations). Tick labels and axis labels sit next to
    their axes: one the canvas cuts off shows as drawn pixels on its edge."""
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes)]
    texts = [*fig.texts, *(t for ax in fig.axes for t in ax.texts)]
    return [
        *(ax.bbox for ax in fig.axes if ax.get_visible()),
        *(legend.get_frame().get_bbox() for legend in legends if legend is not None and legend.get_visible()),
        *(t.get_window_extent(renderer) for t in texts if t.get_visible() and t.get_text()),
    ]


def _within(box, canvas) -> bool:
    """Whether ``box`` lies inside ``canvas`` (display pixels)."""
    return canvas.x0 <= box.x0 and box.x1 <= canvas.x1 and canvas.y0 <= box.y0 and box.y1 <= canvas.y1


def _drawn(rgba: np.ndarray, pad: int) -> np.ndarray | None:
    """``rgba`` (rows top first) cropped to its pixels unlike its corner's, ``pad`` pixels added on
    each side (as far as the canvas goes); None where such a pixel lies on the canvas's edge (it may
    have cut something off) or none differ."""
    pixels = rgba.view(np.uint32)[:, :, 0]  # one number per pixel: one comparison each
    ink = pixels != pixels[0, 0]
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if not len(rows):
        return None
    top, bottom, left, right = rows[0], rows[-1], cols[0], cols[-1]
    if top == 0 or left == 0 or bottom == rgba.shape[0] - 1 or right == rgba.shape[1] - 1:
        return None
    return rgba[max(top - pad, 0) : bottom + pad + 1, max(left - pad, 0) : right + pad + 1]


def _encode(rgba: np.ndarray, dpi: float) -> bytes:
    """PNG bytes of ``rgba`` (rows top first): RGB where every pixel is opaque (a quarter fewer bytes
    to compress), else RGBA; ``dpi`` recorded."""
    from PIL import Image

    opaque = bool((rgba[:, :, 3] == 255).all())
    image = Image.fromarray(np.ascontiguousarray(rgba[:, :, :3] if opaque else rgba))
    buf = io.BytesIO()
    image.save(buf, format="png", compress_level=COMPRESS_LEVEL, dpi=(dpi, dpi))
    return buf.getvalue()
