"""Directives that render ft_launcher's options and exit codes from the code itself.

``cli-reference`` renders ``nvrx.launcher.cli.get_parser()``; ``pet-variables`` lists the
``PET_*`` variable of each of its options; ``exit-codes`` renders
``nvrx.launcher.exit_codes.exit_codes_table()``. All are rebuilt on every docs build, so
the pages can never drift from the code.
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


class PetVariables(Directive):
    """One line per option of the parser: the ``PET_<DEST>`` variable that sets it."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        parser = _parser(self.arguments[0])
        items = nodes.bullet_list()
        seen: set[str] = set()
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            if action.dest in seen or action.dest in ("help", "version"):
                continue
            seen.add(action.dest)
            variable = f"PET_{action.dest.upper()}"
            item = nodes.list_item()
            line = nodes.paragraph()
            line += nodes.literal(variable, variable)
            line += nodes.Text(" sets ")
            line += nodes.literal(action.option_strings[0], action.option_strings[0])
            item += line
            items += item
        return [items]


class ExitCodes(Directive):
    """The launcher's exit code table, as ``ft_launcher --help`` prints it."""

    def run(self) -> list[nodes.Node]:
        from nvrx.launcher.exit_codes import exit_codes_table

        text = exit_codes_table()
        return [nodes.literal_block(text, text)]


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("cli-reference", CliReference)
    app.add_directive("exit-codes", ExitCodes)
    app.add_directive("pet-variables", PetVariables)
    return {"parallel_read_safe": True, "version": "1"}
