"""The command line's run-setting flags, derived from the config fields' settings (:mod:`fedtail.settings`).

A command declares only its own parameters (``--out``, ``--set``, ...) and takes the run settings'
flags with :func:`with_setting_options`: each setting that names the command becomes a Typer option
(its flag, help text and help panel), unset by default (None: the config file's value or the
default applies), and the command is called with keyword arguments.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, Callable, Literal, Optional, Union

import typer

from fedtail.settings import Setting, settings


def _option_type(annotation: Any) -> Any:
    """The Typer type of a setting's flag: its value type made optional (a flag left out is None)."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else str
        origin = typing.get_origin(annotation)
    if origin is Literal or origin is tuple:
        return Optional[str]  # choices are named in the help; MIN:MAX pairs parse as the config does
    if origin is list:
        return Optional[list[str]]
    if annotation in (int, float, str, bool):
        return Optional[annotation]
    return Optional[str]


def _option(item: Setting) -> tuple[inspect.Parameter, Any]:
    annotation = _option_type(item.annotation)
    decls = [item.flag]
    if annotation is Optional[bool]:
        decls = [f"{item.flag}/--no-{item.flag[2:]}"]
    if item.short:
        decls.append(item.short)
    default = typer.Option(None, *decls, help=item.help, rich_help_panel=item.panel)
    return inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation), annotation


def setting_options(command: str, model: Any = None) -> tuple[list[inspect.Parameter], dict[str, Any]]:
    """The parameters (and their annotations) of the run settings that ``command`` shows."""
    from fedtail.config import RunConfig

    params, hints = [], {}
    for item in settings(model or RunConfig):
        if item.name is not None and command in item.commands:
            param, annotation = _option(item)
            params.append(param)
            hints[item.name] = annotation
    return params, hints


def with_setting_options(command: str, model: Any = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the flags of the run settings that name ``command``, before its own
    parameters (its signature's); the command is then called with keyword arguments."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        params, hints = setting_options(command, model)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in inspect.signature(func).parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]  # fmt: skip
        own_hints = typing.get_type_hints(func)

        def wrapped(**kwargs: Any) -> Any:
            return func(**kwargs)

        wrapped.__name__ = func.__name__
        wrapped.__qualname__ = func.__qualname__
        wrapped.__doc__ = func.__doc__
        wrapped.__module__ = func.__module__
        wrapped.__signature__ = inspect.Signature(params + own)  # type: ignore[attr-defined]
        wrapped.__annotations__ = hints | {p.name: own_hints[p.name] for p in own if p.name in own_hints}
        return wrapped

    return decorate
