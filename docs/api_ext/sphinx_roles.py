"""A griffe extension for the API reference: the docstrings cross-reference in Sphinx's style (``:func:`name```,
``:class:`~pkg.Name```, ``:mod:``, ``:data:``, ``:meth:``, ``:attr:``); Markdown has no such roles, so each one is
rendered as the inline code it names (a leading ``~`` keeps the last component, as in Sphinx)."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|data|meth|attr|obj|exc):`(~?)([^`]+)`")


def _plain(match: re.Match) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_plain, obj.docstring.value)
