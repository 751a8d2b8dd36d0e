"""Settings as command-line flags: each field of a settings dataclass carries its flag and its help
(`setting`); this module adds those flags to a parser, reads the parsed values back into the
dataclass, and writes a dataclass out as the argument list that sets it.

`pagoda-runtime serve`, the offline benchmarks and the step profile declare their flags from the
same fields, and the operator takes its defaults and descriptions from them and renders a pod's
arguments with `to_args`, so that a flag is spelled, defaulted and explained in one place.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from collections.abc import Callable, Iterable
from typing import Any

_KEY = "flag"


@dataclasses.dataclass(frozen=True)
class Flag:
    # What the setting does, as `serve --help` and (other --flags named as spec fields) the CRD say it.
    help: str
    name: str | None = None  # the option; default: --field-name
    short: str | None = None  # a short alias, as vLLM's -tp
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None  # one command-line string -> the value
    many: bool = False  # a tuple given as several words (--served-model-name a b)
    off: str | None = None  # another option that sets the boolean False (vLLM's --disable-...)


def setting(default: Any, help: str, **flag: Any) -> Any:
    """A dataclass field with its flag: `max_num_seqs: int = setting(256, "...")`."""
    return dataclasses.field(default=default, metadata={_KEY: Flag(help, **flag)})


def flag_of(cls: type, name: str) -> Flag:
    return _fields(cls)[name].metadata[_KEY]


def default_of(cls: type, name: str) -> Any:
    return _fields(cls)[name].default


def option(cls: type, name: str) -> str:
    """The option that sets field `name` of `cls` (--max-num-seqs)."""
    return flag_of(cls, name).name or "--" + name.replace("_", "-")


def add_flags(parser, cls: type, names: Iterable[str] | None = None, **defaults: Any) -> None:
    """Adds the flags of `cls`'s fields (those in `names`, when given) to an argparse parser or group;
    `defaults` replaces the dataclass's default of a field for this parser."""
    wanted = None if names is None else set(names)
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        flag = field.metadata.get(_KEY)
        if flag is None or (wanted is not None and field.name not in wanted):
            continue
        default = defaults.get(field.name, field.default)
        options = [option(cls, field.name), *([flag.short] if flag.short else [])]
        kind = _kind(hints[field.name])
        arguments: dict[str, Any] = {
            "dest": field.name,
            "default": default,
            "help": _help(flag.help, default),
        }
        if kind is bool:
            arguments["action"] = "store_true" if _is_switch(field) else argparse.BooleanOptionalAction
        else:
            arguments["type"] = _argument_type(flag.parse) if flag.parse else (str if kind is tuple else kind)
            if flag.choices:
                arguments["choices"] = flag.choices
            else:
                arguments["metavar"] = options[0].removeprefix("--").upper().replace("-", "_")
            if flag.many:
                arguments["nargs"] = "+"
        parser.add_argument(*options, **arguments)
        if flag.off:
            parser.add_argument(
                flag.off,
                dest=field.name,
                action="store_const",
                const=False,
                help=f"the same as --no-{options[0].removeprefix('--')} (vLLM's spelling)",
            )


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` for argparse: its ValueError's sentence becomes the usage error, not "invalid value"."""

    def read(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    read.__name__ = parse.__name__
    return read


def from_args(cls: type, args: argparse.Namespace, **values: Any):
    """`cls` from the parsed flags: each field the namespace holds, `values` over them, defaults for
    the rest."""
    hints = typing.get_type_hints(cls)
    read = {}
    for field in dataclasses.fields(cls):
        if field.name in values or not hasattr(args, field.name):
            continue
        value = getattr(args, field.name)
        read[field.name] = tuple(value) if _kind(hints[field.name]) is tuple else value
    return cls(**read, **values)


def to_args(names: Iterable[str], *settings: Any) -> list[str]:
    """The arguments that set the fields `names`, in that order, to their values in `settings` (each
    name is looked up in the first of them that has a flag for it); a None value is left out."""
    args: list[str] = []
    for name in names:
        owner = _owner(name, settings)
        args += _words(type(owner), name, getattr(owner, name))
    return args


def _owner(name: str, settings: tuple[Any, ...]) -> Any:
    for candidate in settings:
        field = _fields(type(candidate)).get(name)
        if field is not None and _KEY in field.metadata:
            return candidate
    raise KeyError(f"no flag sets {name!r} in {', '.join(type(s).__name__ for s in settings)}")


def _words(cls: type, name: str, value: Any) -> list[str]:
    flag, field, spelled = flag_of(cls, name), _fields(cls)[name], option(cls, name)
    if value is None or (value is False and _is_switch(field)) or (flag.many and value == ()):
        return []
    if isinstance(value, bool):
        return [spelled if value else "--no-" + spelled.removeprefix("--")]
    if isinstance(value, tuple):
        return [spelled, *value] if flag.many else [spelled, json.dumps(list(value))]
    if isinstance(value, dict):
        return [spelled, json.dumps(value)]
    return [spelled, str(value)]


def _is_switch(field: dataclasses.Field) -> bool:
    """A boolean that is off unless its flag is given; the others also take --no-<flag>."""
    return field.default is False and field.metadata[_KEY].off is None


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _kind(hint: Any) -> type:
    """int for `int | None`, tuple for `tuple[str, ...]`."""
    if typing.get_origin(hint) is tuple:
        return tuple
    members = [m for m in typing.get_args(hint) if m is not type(None)]
    return _kind(members[0]) if members else hint


def _help(text: str, default: Any) -> str:
    if "default" in text or default is None or default is False or isinstance(default, tuple):
        return text
    return f"{text} (default: {'on' if default is True else default})"
