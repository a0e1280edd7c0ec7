"""The command groups' class: typer's group whose help flag defaults to False.

typer coerces an option's value through a pydantic ``TypeAdapter`` unless it is a bool
flag holding a bool, and its help flag holds ``None`` when not given: every command
line that passes through a group (``compactor compact --help``, ``compactor db upgrade
--help``) imported pydantic and built an adapter for the group's unused ``--help``
(~45 ms of a command's ~0.17 s help on a quiet core). A ``False`` default takes typer's
bool fast path; the flag's callback acts only on a true value either way.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup


class CommandGroup(TyperGroup):
    """A typer group whose unused ``--help`` is processed without pydantic."""

    # typer passes its own Context; the base class names typer's private click copy's.
    def get_help_option(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        option = super().get_help_option(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option
