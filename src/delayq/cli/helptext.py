"""Help pages without type noise.

Typer's rich help shows each parameter's Python type (``<bool>`` on every flag,
``<list[str]>``, ``<int range>`` and a range like ``[0<=x<=10000]``), and a choice list as a
type, which rich wraps mid-word at 80 columns; the usage line writes a required argument as
``{QUEUE}``. Typer has no setting for any of this, so :func:`quiet` gives each parameter of the
built command a subclass that shows what a person types instead: the metavar (``URL``,
``DURATION``, ``N``), nothing for a flag, an argument by its name. Limits and choices are
stated in each option's help text. It also joins the lines of each help paragraph, which
typer keeps as the docstring wraps them.
"""

from __future__ import annotations

import inspect
from typing import Any

import typer
from typer.core import TyperArgument, TyperOption

# Typer carries its own copy of click; its classes are the ones to name here.
Command = Any


class _QuietOption(TyperOption):
    def display_type_rich(self, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None
        return self.metavar or (self.name or "value").upper()

    def _get_number_range_help_str(self) -> str | None:
        return None


class _QuietArgument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        # Our metavars are written as the usage shows them: QUEUE, ID..., [QUEUE]...
        return self.metavar or (self.name or "ARG").upper()


def reflow(text: str) -> str:
    """``text`` with each paragraph on one line: typer keeps a docstring's line breaks, which
    rich then wraps again at the terminal's width (a ragged page at 80 columns)."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def quiet(command: Command, parent: typer.Context | None = None, name: str = "delayq") -> Command:
    """``command`` and its subcommands with plain help (changed in place, returned)."""
    ctx = typer.Context(command, parent=parent, info_name=name, **command.context_settings)
    if command.help:
        command.help = reflow(command.help)
    command.get_help_option(ctx)  # made on first use, inheriting -h/--help: make it now
    for param in [*command.params, command.get_help_option(ctx)]:
        # A subclass that only overrides how the parameter is shown: parsing is unchanged.
        if type(param) is TyperOption:
            param.__class__ = _QuietOption
        elif type(param) is TyperArgument:
            param.__class__ = _QuietArgument
    commands: dict[str, Any] = getattr(command, "commands", {})
    for sub_name, sub in commands.items():
        quiet(sub, ctx, sub_name)
    return command
