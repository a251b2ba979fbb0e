"""A ``cli-reference`` directive: the ft_launcher options, generated from its parser.

The reference is rebuilt from ``nvrx.launcher.cli.get_parser()`` on every docs build,
so the page can never drift from the code.
"""

from __future__ import annotations

import argparse
import importlib

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx


def _parser(path: str) -> argparse.ArgumentParser:
    module_name, _, func = path.partition(":")
    factory = getattr(importlib.import_module(module_name), func)
    parser: argparse.ArgumentParser = factory()
    return parser


class CliReference(Directive):
    """Render every option group of an argparse parser as a definition list."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        parser = _parser(self.arguments[0])
        sections: list[nodes.Node] = []
        usage = parser.format_usage().strip()
        sections.append(nodes.literal_block(usage, usage))
        for group in parser._action_groups:
            actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
            if not actions:
                continue
            title = group.title or "options"
            section = nodes.section(ids=[nodes.make_id(f"cli-{title}")])
            section += nodes.title(title, title)
            if group.description:
                section += nodes.paragraph(group.description, group.description)
            items = nodes.definition_list()
            for action in actions:
                flags = ", ".join(action.option_strings) or action.dest
                if action.metavar is not None and action.option_strings:
                    flags += f" {action.metavar}"
                help_text = (action.help or "") % {"default": action.default, "prog": parser.prog}
                if action.default not in (None, argparse.SUPPRESS, False) and "%(default)" not in (
                    action.help or ""
                ):
                    help_text += f" (default: {action.default})"
                item = nodes.definition_list_item()
                item += nodes.term(flags, "", nodes.literal(flags, flags))
                definition = nodes.definition()
                definition += nodes.paragraph(help_text, help_text)
                item += definition
                items += item
            section += items
            sections.append(section)
        return sections


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("cli-reference", CliReference)
    return {"parallel_read_safe": True, "version": "1"}
