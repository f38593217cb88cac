"""A tiny document model rendered twice: Markdown (plots as PNG files beside it) and one
self-contained HTML page (plots embedded as base64 data URIs). No third-party dependency.

Inline markup understood in text: ``code`` between backticks and **bold**.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field


@dataclass
class Image:
    """A figure of the document.

    Attributes:
        name: its file name beside the Markdown (letters, digits, ``._-`` only).
        png: the PNG bytes; empty bytes when plots are not rendered (the figure is then left out).
        alt: its caption, also the alternative text (inline markup allowed).
    """

    name: str  # file name, letters/digits/._- only
    png: bytes
    alt: str


@dataclass
class Doc:
    """A document: a title and blocks in order, appended by the methods below.

    Attributes:
        title: the top heading (and the HTML page's title).
        blocks: ``("h", level, text)``, ``("p", text)``, ``("ul", items)``, ``("table", headers,
            rows, note)``, ``("note", kind, text)``, ``("img", Image)`` or ``("answer", items,
            Image | None)``; rows hold strings.
    """

    title: str
    blocks: list[tuple] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        """A heading; level 1 is the first below the title (Markdown ``##``, HTML ``<h2>``)."""
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        """A paragraph."""
        self.blocks.append(("p", text))

    def ul(self, items: list[str]) -> None:
        """A bulleted list; an empty one is left out."""
        if items:
            self.blocks.append(("ul", list(items)))

    def table(self, headers: list[str], rows: list[list], note: str | None = None) -> None:
        """A table; cells become text (None -> ``-``, bools -> ``yes``/``no``), a column of numbers
        is right-aligned; ``note`` is printed under it."""
        self.blocks.append(("table", list(headers), [[_cell(c) for c in r] for r in rows], note))

    def note(self, kind: str, text: str) -> None:
        """A call-out: kind is 'warning' (something to act on) or 'info'."""
        self.blocks.append(("note", kind, text))

    def image(self, image: Image) -> None:
        """A figure; one with empty PNG bytes (plots not rendered) is left out."""
        if image.png:  # an empty figure (plots not rendered) is left out
            self.blocks.append(("img", image))

    def answer(self, items: list[str], image: Image | None) -> None:
        """The answer block: statements (inline markup) beside the main plot; rendered in HTML
        as one row (``id="answer"``, the plot ``id="main-plot"``), in Markdown as a heading
        "Answer", a list and the figure. A figure with empty PNG bytes is left out."""
        self.blocks.append(("answer", list(items), image if image is not None and image.png else None))

    @property
    def images(self) -> list[Image]:
        """The figures, in order (the writer saves each as ``<plot dir>/<name>``)."""
        out = []
        for b in self.blocks:
            if b[0] == "img":
                out.append(b[1])
            elif b[0] == "answer" and b[2] is not None:
                out.append(b[2])
        return out


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _md_escape_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: Doc, image_dir: str) -> str:
    """The document as Markdown.

    Args:
        doc: the document.
        image_dir: the directory the figures are saved in, relative to the Markdown file.

    Returns:
        The Markdown text; figures are referenced as ``image_dir/<name>``.
    """
    out = [f"# {doc.title}", ""]
    for block in doc.blocks:
        kind = block[0]
        if kind == "h":
            out += ["#" * (block[1] + 1) + " " + block[2], ""]
        elif kind == "p":
            out += [block[1], ""]
        elif kind == "ul":
            out += [f"- {item}" for item in block[1]] + [""]
        elif kind == "table":
            _, headers, rows, note = block
            out.append("| " + " | ".join(_md_escape_cell(h) for h in headers) + " |")
            out.append(
                "|" + "|".join(" ---: " if _numeric_column(rows, i) else " --- " for i in range(len(headers))) + "|"
            )
            out += ["| " + " | ".join(_md_escape_cell(c) for c in row) + " |" for row in rows]
            out.append("")
            if note:
                out += [f"*{note}*", ""]
        elif kind == "note":
            label = "**Warning:**" if block[1] == "warning" else "**Note:**"
            out += [f"> {label} {block[2]}", ""]
        elif kind == "img":
            img = block[1]
            out += [f"![{img.alt}]({image_dir}/{img.name})", ""]
        elif kind == "answer":
            out += ["## Answer", ""] + [f"- {item}" for item in block[1]] + [""]
            if block[2] is not None:
                out += [f"![{block[2].alt}]({image_dir}/{block[2].name})", ""]
    return "\n".join(out).rstrip() + "\n"


_NUM = re.compile(r"^[-+]?[\d,]+(\.\d+)?( ?%)?$")


def _numeric_column(rows: list[list[str]], i: int) -> bool:
    cells = [r[i] for r in rows if i < len(r) and r[i] not in ("-", "")]
    return bool(cells) and all(_NUM.match(c) for c in cells)


_CODE = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")  # a Markdown link
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


_SPECIAL = re.compile(r"[&<>`*\[]")
"""A character that escaping or inline markup changes: text without any is its own HTML."""


def _inline(text: str) -> str:
    """Text as HTML: escaped, with its inline markup (code, links, bold) as elements."""
    if not _SPECIAL.search(text):
        return text
    text = html.escape(text, quote=False)
    if "`" in text:
        text = _CODE.sub(r"<code>\1</code>", text)
    if "](" in text:
        text = _LINK.sub(r'<a href="\2">\1</a>', text)
    return _BOLD.sub(r"<strong>\1</strong>", text) if "**" in text else text


_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; border-bottom: 2px solid #444; } h2 { border-bottom: 1px solid #bbb; margin-top: 1.6em; }
h3 { margin-top: 1.3em; } code { background: #f2f2f2; padding: 0 .2em; border-radius: 3px; }
table { border-collapse: collapse; margin: .6em 0; font-size: .88em; }
.table-wrap { max-width: 100%; overflow-x: auto; } p, li, figcaption, .note, .warning { overflow-wrap: anywhere; }
th, td { border: 1px solid #ccc; padding: .25em .55em; vertical-align: top; }
th { background: #f0f0f0; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.note { border-left: 4px solid #1f77b4; background: #eef5fb; padding: .4em .8em; margin: .7em 0; }
.warning { border-left: 4px solid #d62728; background: #fdeeee; padding: .4em .8em; margin: .7em 0; }
figure { margin: .8em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: .85em; color: #555; } .tnote { font-size: .85em; color: #555; margin-top: -.3em; }
.answer { display: flex; flex-wrap: wrap; gap: 1.2em; align-items: flex-start; background: #f7faf7;
          border: 1px solid #cfe3cf; border-radius: 6px; padding: .6em 1em; margin: .4em 0 1em; }
.answer-text { flex: 1 1 340px; font-size: .95em; } .answer-text h2 { margin-top: .2em; }
.answer-text li { margin-bottom: .35em; } .answer figure { flex: 1 1 560px; margin: 0; }
footer { margin-top: 2em; font-size: .8em; color: #666; border-top: 1px solid #ccc; padding-top: .5em; }
"""

# Checks, once the page has loaded, that every embedded plot decoded, and records any script
# error; the result is written into the page (footer and data-* attributes on <html>), so a
# reader sees it and a headless browser's DOM dump can be checked.
_SELF_CHECK = """
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message || e)); });
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.querySelectorAll('figure img'));
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  var root = document.documentElement;
  root.setAttribute('data-plots-total', imgs.length);
  root.setAttribute('data-plots-rendered', ok);
  root.setAttribute('data-errors', window.__errors.length);
  // the page's width against the window's: wider means the page scrolls sideways
  root.setAttribute('data-scroll-width', root.scrollWidth);
  root.setAttribute('data-client-width', root.clientWidth);
  // where the answer and the main plot end on the page (CSS pixels from the top)
  [['answer', 'data-answer-bottom'], ['main-plot', 'data-main-plot-bottom']].forEach(function (p) {
    var e = document.getElementById(p[0]);
    if (e) { root.setAttribute(p[1], Math.round(e.getBoundingClientRect().bottom + window.scrollY)); }
  });
  var el = document.getElementById('self-check');
  if (el) { el.textContent = 'plots rendered: ' + ok + ' of ' + imgs.length +
            (window.__errors.length ? '; script errors: ' + window.__errors.join('; ') : ''); }
});
"""


def _figure(img: Image, attrs: str = "") -> str:
    """A figure as HTML: the PNG embedded as a data: URI, its caption below."""
    data = base64.b64encode(img.png).decode("ascii")
    return (
        f'<figure{" " + attrs if attrs else ""}><img src="data:image/png;base64,{data}" alt="{html.escape(img.alt)}">'
        f"<figcaption>{_inline(img.alt)}</figcaption></figure>"
    )


def _table_html(headers: list, rows: list[list], note: str | None) -> list[str]:
    """A table as HTML lines: numeric columns marked for right alignment, its note below."""
    numeric = [_numeric_column(rows, i) for i in range(len(headers))]
    parts = [
        '<div class="table-wrap"><table><thead><tr>'
        + "".join(f"<th>{_inline(h)}</th>" for h in headers)
        + "</tr></thead><tbody>"
    ]
    for row in rows:
        parts.append(
            "<tr>"
            + "".join(
                f'<td class="num">{_inline(c)}</td>' if numeric[i] else f"<td>{_inline(c)}</td>"
                for i, c in enumerate(row)
            )
            + "</tr>"
        )
    parts.append("</tbody></table></div>")  # a table wider than the page scrolls inside its box
    if note:
        parts.append(f'<p class="tnote">{_inline(note)}</p>')
    return parts


def _block_html(block: tuple) -> list[str]:
    """One block of a ``Doc`` (heading, paragraph, list, table, note, image, answer) as HTML lines."""
    kind = block[0]
    if kind == "h":
        level = min(block[1] + 1, 6)
        anchor = re.sub(r"[^a-z0-9]+", "-", block[2].lower()).strip("-")
        return [f'<h{level} id="{anchor}">{_inline(block[2])}</h{level}>']
    if kind == "p":
        return [f"<p>{_inline(block[1])}</p>"]
    if kind == "ul":
        return ["<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block[1]) + "</ul>"]
    if kind == "table":
        return _table_html(block[1], block[2], block[3])
    if kind == "note":
        cls = "warning" if block[1] == "warning" else "note"
        label = "Warning:" if cls == "warning" else "Note:"
        return [f'<div class="{cls}"><strong>{label}</strong> {_inline(block[2])}</div>']
    if kind == "img":
        return [_figure(block[1])]
    if kind == "answer":
        items = "".join(f"<li>{_inline(i)}</li>" for i in block[1])
        return [
            '<section id="answer" class="answer"><div class="answer-text"><h2 id="answer-heading">Answer</h2>'
            f"<ul>{items}</ul></div>"
            + (_figure(block[2], 'id="main-plot"') if block[2] is not None else "")
            + "</section>"
        ]
    return []


def to_html(doc: Doc, footer: str = "") -> str:
    """The document as one self-contained HTML page: CSS inline, plots as data: URIs, no
    external resource, and a script that writes into the page whether every plot decoded.

    Args:
        doc: the document.
        footer: a line of text for the page's footer (inline markup allowed).

    Returns:
        The HTML text.
    """
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(doc.title)}</title>",
        f"<style>{_CSS}</style>",
        f"<script>{_SELF_CHECK}</script>",
        "</head>",
        "<body>",
        f"<h1>{_inline(doc.title)}</h1>",
    ]
    for block in doc.blocks:
        parts += _block_html(block)
    parts.append(
        f'<footer>{_inline(footer)}<br><span id="self-check">plots not checked (scripts disabled)</span></footer>'
    )
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"
