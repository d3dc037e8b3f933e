"""One look for every `--help` of the command line (`batchscope`, each subcommand, and the tools' own entry points
`python -m batchscope.app.soak` / `.bench`): the same formatter, and each option's default said the same way,
"(default: X)", whether or not the option has a help text. argparse only: `--help` loads nothing heavy."""
from __future__ import annotations

import argparse
import copy


class HelpFormatter(argparse.HelpFormatter):
    """argparse's own layout, plus "(default: X)" after each option that has a default worth showing (not None,
    not False, not empty) and whose help does not say its default already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if _shows_default(action) and "default" not in text.lower():
            text = f"{text} (default: %(default)s)".lstrip()
        return text

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and _shows_default(action):
            action = copy.copy(action)      # an option with no help text still gets its default shown
            action.help = "(default: %(default)s)"
        return super()._format_action(action)


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    if argparse.SUPPRESS in (action.help, default) or default is None or default is False or default in ("", []):
        return False                    # `is False`: a default of 0 is worth showing
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return False
    return bool(action.option_strings) or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)


def apply_everywhere(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give `parser` and every subcommand under it the one formatter, and a subcommand that has only a one-line
    `help` (what the command list shows) that line as its own --help's description."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if sub.description is None and helps.get(name):
                    sub.description = helps[name][0].upper() + helps[name][1:] + "."
                apply_everywhere(sub)
    return parser
