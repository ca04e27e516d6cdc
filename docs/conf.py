"""Sphinx configuration of durableruns' documentation site: Markdown pages (MyST) and the Python reference from
the code's own docstrings (autodoc).

Build: .venv/bin/python -m sphinx -W --keep-going -b html docs var/docs-html (bin/test does, warnings as errors).
Autodoc imports the app, so Django is set up first, with settings of the docs' own (docs/_ext/docs_settings.py:
the app and what it builds on, not the demo site's), so the `docs` extra alone builds it: pip install -e '.[docs]'.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]
os.environ["DJANGO_SETTINGS_MODULE"] = "docs_settings"

import django  # noqa: E402

django.setup()

from durableruns import __version__  # noqa: E402

project = "durableruns"
author = "The durableruns authors"
copyright = "the durableruns authors"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "durableruns_docs",  # docs/_ext: the commands' options from their parsers, and the completeness checks
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
root_doc = "index"

# Markdown: ::: fences for admonitions, definition lists, and anchors for headings down to ###, so a page links
# to another's section as [text](other.md#section-slug).
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The docstrings are written in plain prose with `backticks` for names: show those as code, as on the pages.
default_role = "literal"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"

html_theme = "furo"
html_title = f"durableruns {release}"
html_static_path: list[str] = []
