"""How a table read is scored against its truth (harness/tables.py), per
table and per style, for load_tests/bench_structure.py and the tests:

- cells exact: the fraction of the truth's cells whose text (whitespace
  collapsed) is the text of the read cell anchored at the same row and
  column;
- shape right: the read grid has the truth's rows and columns and every
  cell's place and spans (row, col, rowspan, colspan);
- TEDS as PubTabNet defines it (Zhong et al. 2020, "Image-based table
  recognition", and its src/metric.py): 1 - EditDist(T_pred, T_true) /
  max(|T_pred|, |T_true|) over the HTML trees under <table>, where
  inserting or deleting a node costs 1, renaming costs 1 unless the tags
  and spans match, and two <td> cost the Levenshtein distance of their
  content tokens over the longer one. The edit distance is Zhang and
  Shasha's (1989) ordered tree edit distance, which is what APTED computes
  (both exact).

Both sides are read from HTML with the standard library's parser, so the
service's `Table.html` and RapidTable's output are scored the same way."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

from harness.peer import iou
from serve_app.inference.precision_check import edit_distance


@dataclass
class Node:
    tag: str
    colspan: int | None = None
    rowspan: int | None = None
    content: tuple[str, ...] = ()  # a <td>'s tokens: its nested tags and characters
    children: list["Node"] = field(default_factory=list)


@dataclass(frozen=True)
class GridCell:
    row: int
    col: int
    rowspan: int
    colspan: int
    text: str


class _TreeParser(HTMLParser):
    """The first <table> as a Node tree; a <td>/<th>'s inside is its
    content as tokens (PubTabNet's tokenize: '<b>', characters, '</b>')."""

    def __init__(self, ignore: tuple[str, ...] = ()):
        super().__init__(convert_charrefs=True)
        self.ignore = ignore
        self.root: Node | None = None
        self.stack: list[Node] = []
        self.cell: Node | None = None
        self.cell_depth = 0
        self.done = False

    def handle_starttag(self, tag, attrs):
        if self.done:
            return
        if self.cell is not None:
            self.cell_depth += 1
            self.cell.content += (f"<{tag}>",)
            return
        if self.root is None and tag != "table":
            return
        if self.root is not None and tag in self.ignore:
            return  # stripped as lxml's strip_tags does: its children join its parent
        a = dict(attrs)
        if tag in ("td", "th"):
            node = Node("td", _int(a.get("colspan")), _int(a.get("rowspan")))
            self.stack[-1].children.append(node)
            self.cell, self.cell_depth = node, 0
            return
        node = Node(tag)
        if self.root is None:
            self.root = node
        else:
            self.stack[-1].children.append(node)
        self.stack.append(node)

    def handle_endtag(self, tag):
        if self.done or self.root is None:
            return
        if self.cell is not None:
            if self.cell_depth == 0 and tag in ("td", "th"):
                self.cell = None
            elif self.cell_depth > 0:
                self.cell_depth -= 1
                self.cell.content += (f"</{tag}>",)
            return
        if tag in self.ignore and tag != "table":
            return
        while self.stack:
            node = self.stack.pop()
            if node.tag == tag:
                break
        if not self.stack:
            self.done = True

    def handle_data(self, data):
        if self.cell is not None and not self.done:
            self.cell.content += tuple(data)


def _int(v) -> int:
    try:
        return max(1, int(v))
    except (TypeError, ValueError):
        return 1


def html_tree(html: str, ignore: tuple[str, ...] = ()) -> Node | None:
    """The first <table> of `html` as a tree (None if it has none), the
    tags in `ignore` left out (their children kept)."""
    p = _TreeParser(ignore)
    p.feed(html or "")
    p.close()
    return p.root


def _cell_text(node: Node) -> str:
    return " ".join("".join(t for t in node.content if not t.startswith("<")).split())


def grid(html: str) -> list[GridCell]:
    """The table's cells with their grid places, as a browser lays them
    out: each cell takes the first column its row leaves free of the spans
    from rows above."""
    root = html_tree(html)
    if root is None:
        return []
    rows: list[Node] = []

    def walk(n: Node) -> None:
        for c in n.children:
            if c.tag == "tr":
                rows.append(c)
            elif c.tag != "td":
                walk(c)

    walk(root)
    taken: set[tuple[int, int]] = set()
    cells = []
    for r, tr in enumerate(rows):
        col = 0
        for td in (c for c in tr.children if c.tag == "td"):
            while (r, col) in taken:
                col += 1
            rs, cs = td.rowspan or 1, td.colspan or 1
            cells.append(GridCell(r, col, rs, cs, _cell_text(td)))
            taken.update((r + i, col + j) for i in range(rs) for j in range(cs))
            col += cs
    return cells


def shape(cells: list[GridCell]) -> tuple[int, int]:
    """(rows, columns) the cells cover."""
    if not cells:
        return 0, 0
    return max(c.row + c.rowspan for c in cells), max(c.col + c.colspan for c in cells)


def norm(text: str) -> str:
    return " ".join(text.split())


def cells_exact(read: list[GridCell], truth: list[GridCell]) -> tuple[int, int]:
    """(truth cells whose text the read cell at the same row and column has, truth cells)."""
    at = {(c.row, c.col): norm(c.text) for c in read}
    return sum(at.get((c.row, c.col)) == norm(c.text) for c in truth), len(truth)


def shape_right(read: list[GridCell], truth: list[GridCell]) -> bool:
    """The same rows and columns, and every cell in the same place with the same spans."""
    key = lambda cs: sorted((c.row, c.col, c.rowspan, c.colspan) for c in cs)  # noqa: E731
    return shape(read) == shape(truth) and key(read) == key(truth)


HEADER_MARKUP = ("thead", "tbody")

# --- an answer's regions ----------------------------------------------------------------------------


def _quad(box) -> list[list[float]]:
    x0, y0, x1, y1 = box
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def table_html(answer: dict, box: tuple[int, int, int, int]) -> str | None:
    """The HTML of the answer's table region that overlaps the true table
    most (IoU >= 0.3), None if it found none there."""
    best, best_iou = None, 0.3
    for r in answer.get("regions") or ():
        if r["type"] == "table" and r.get("table"):
            v = iou(r["box"], _quad(box))
            if v >= best_iou:
                best, best_iou = r["table"]["html"], v
    return best


def title_found(answer: dict, title: str) -> bool:
    """A `title` region whose lines read the title."""
    texts = [line["text"] for line in answer.get("results", ())]
    for r in answer.get("regions") or ():
        if r["type"] == "title" and norm(" ".join(texts[i] for i in r["lines"])) == norm(title):
            return True
    return False


# --- TEDS -------------------------------------------------------------------------------------------------


def _rename(a: Node, b: Node) -> float:
    if a.tag != b.tag or a.colspan != b.colspan or a.rowspan != b.rowspan:
        return 1.0
    if a.tag == "td" and (a.content or b.content):
        return edit_distance(a.content, b.content) / max(len(a.content), len(b.content))
    return 0.0


def _postorder(root: Node) -> tuple[list[Node], list[int]]:
    """Nodes in post-order and each one's leftmost leaf's post-order index."""
    nodes: list[Node] = []
    lml: list[int] = []

    def visit(n: Node) -> int:
        first = None
        for c in n.children:
            leaf = visit(c)
            first = leaf if first is None else first
        nodes.append(n)
        lml.append(len(nodes) - 1 if first is None else first)
        return lml[-1]

    visit(root)
    return nodes, lml


def tree_edit_distance(t1: Node, t2: Node, rename=_rename) -> float:
    """Zhang-Shasha: the least total cost of inserts and deletes (1 each)
    and renames (`rename`) that turn t1 into t2."""
    n1, l1 = _postorder(t1)
    n2, l2 = _postorder(t2)
    keys1 = [i for i in range(len(n1)) if all(l1[j] != l1[i] for j in range(i + 1, len(n1)))]
    keys2 = [j for j in range(len(n2)) if all(l2[k] != l2[j] for k in range(j + 1, len(n2)))]
    td = [[0.0] * len(n2) for _ in n1]
    for i in keys1:
        for j in keys2:
            li, lj = l1[i], l2[j]
            m, n = i - li + 2, j - lj + 2
            fd = [[0.0] * n for _ in range(m)]
            for x in range(1, m):
                fd[x][0] = fd[x - 1][0] + 1
            for y in range(1, n):
                fd[0][y] = fd[0][y - 1] + 1
            for x in range(1, m):
                for y in range(1, n):
                    a, b = li + x - 1, lj + y - 1
                    if l1[a] == li and l2[b] == lj:
                        fd[x][y] = min(fd[x - 1][y] + 1, fd[x][y - 1] + 1,
                                       fd[x - 1][y - 1] + rename(n1[a], n2[b]))
                        td[a][b] = fd[x][y]
                    else:
                        p, q = l1[a] - li, l2[b] - lj
                        fd[x][y] = min(fd[x - 1][y] + 1, fd[x][y - 1] + 1, fd[p][q] + td[a][b])
    return td[-1][-1]


def _count(n: Node) -> int:
    return 1 + sum(_count(c) for c in n.children)


def teds(read_html: str, truth_html: str, ignore: tuple[str, ...] = HEADER_MARKUP) -> float:
    """PubTabNet's TEDS of a read table's HTML against the truth's (0 when
    either has no <table>), with its `ignore_nodes` as `ignore`: by default
    <thead> and <tbody>, which RapidTable leaves out, so a perfect read
    scores 1.0 whether or not a reader marks the header (ignore=() scores
    them as PubTabNet's default does)."""
    a, b = html_tree(read_html, ignore), html_tree(truth_html, ignore)
    if a is None or b is None:
        return 0.0
    n_nodes = max(_count(a), _count(b)) - 1  # PubTabNet counts the nodes under <table>
    if n_nodes == 0:
        return 1.0
    return 1.0 - tree_edit_distance(a, b) / n_nodes
