"""Document structure as pure stages (numpy/OpenCV, no Ray, no paddle):
the layout detector's pre/post-processing (layout.py: PicoDet on CDLA's ten
region types), the table-structure recogniser's (table_structure.py:
SLANet_plus), the matcher that puts a page's recognised lines into a
table's cells (table_match.py), and the regions of a page in reading order
(regions.py). The runners that call the models are
serve_app.inference.runners.LayoutDetector and TableRecognizer."""

from serve_app.structure.layout import LayoutBox
from serve_app.structure.regions import assemble_regions, assign_lines
from serve_app.structure.table_match import match_table
from serve_app.structure.table_structure import TableStructure

__all__ = ["LayoutBox", "TableStructure", "match_table", "assemble_regions", "assign_lines"]
