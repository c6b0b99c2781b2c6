"""A Markdown extension that renders Sphinx roles in docstrings as code.

Some docstrings name objects the Sphinx way (``:func:`simulate```,
``:class:`~vlcc_adjoint.storage.TieredStore```); mkdocstrings passes them to
Markdown as written.  This preprocessor turns each into a code span of the
name (the last component where the target starts with ``~``) and turns
reStructuredText's double-backtick literals into single-backtick code.
"""

import re

from markdown import Extension
from markdown.preprocessors import Preprocessor

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")
FENCE = re.compile(r"^\s*(```|~~~)")


def _role(m: re.Match) -> str:
    target = m.group(2)
    return f"`{target.rsplit('.', 1)[-1] if m.group(1) else target}`"


class _Roles(Preprocessor):
    def run(self, lines):
        out, fenced = [], False
        for line in lines:
            if FENCE.match(line):
                fenced = not fenced
            out.append(line if fenced else ROLE.sub(_role, line))
        return out


class SphinxRolesExtension(Extension):
    def extendMarkdown(self, md):
        md.preprocessors.register(_Roles(md), "sphinx_roles", 30)


def makeExtension(**kwargs):
    return SphinxRolesExtension(**kwargs)
