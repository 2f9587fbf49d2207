"""What every command shares: its options generated from the typed configs (each default, choice
and help text lives once, on its config field, ``nmt.config.opt``), the paths it was given marked for
the output guard, its log format, and ``run_main``, which turns user errors into one line. The
``cli/`` files only build their parsers from configs and call the library.

A field ``max_tokens`` of a section stored under ``data.batching`` becomes ``--max-tokens`` with
``dest="data.batching.max_tokens"``; ``config_from_args`` rebuilds the nested dataclasses from the
namespace. Types map to argparse as: bool -> a flag (``store_true``; ``--X/--no-X`` for the model
flags over a preset); ``tuple[float, float]`` -> two values (or fairseq's ``'(0.9, 0.98)'``);
``tuple[X, ...]`` -> one comma-separated value; ``list[str]`` -> comma-separated and repeatable;
``X | None`` -> X with default None; a positional field with a default is optional.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from nmt.config import field_types, option_name
from nmt.fileio import PATH_KINDS, PathOption

T = TypeVar("T")


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default (tuples as they are typed: ``a,b``), when it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            default in (None, False, argparse.SUPPRESS)
            or action.option_strings == []
            or "default:" in text
        ):
            return text
        if isinstance(default, tuple):
            default = (" " if action.nargs else ",").join(map(str, default))
        return f"{text} (default: {str(default).replace('%', '%%')})".strip()


class ArgumentParser(argparse.ArgumentParser):
    """argparse without abbreviations: fairseq's ``--save-interval`` must never be taken for
    ``--save-interval-updates``, nor any prefix for a longer flag. Options of n numbers also take
    them as fairseq writes them, in one word: ``--adam-betas '(0.9, 0.98)'``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        words = list(sys.argv[1:] if args is None else args)
        sizes = {
            option: action.nargs
            for action in self._actions
            if isinstance(action.nargs, int) and action.nargs > 1
            for option in action.option_strings
        }
        spread: list[str] = []
        for word in words:
            option, equals, value = word.partition("=")
            if equals and option in sizes:
                spread += [option, value]
            else:
                spread.append(word)
        words = []
        for position, word in enumerate(spread):
            previous = spread[position - 1] if position else None
            if previous in sizes and ("," in word or word.startswith("(")):
                words += word.strip().strip("()[]").replace(",", " ").split()
            else:
                words.append(word)
        return super().parse_known_args(words, namespace)


def _unwrap_optional(kind: Any) -> tuple[Any, bool]:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(kind)) == 2:
            return args[0], True
    return kind, False


def _comma_list(item_type: Callable[[str], Any], option: str) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(item_type(part.strip()) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a comma-separated list of {item_type.__name__}: {text!r}"
            ) from None

    parse.__name__ = f"comma-separated {item_type.__name__} list ({option})"
    return parse


def add_config_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    dest_prefix: str = "",
    only_when_given: bool = False,
    skip: tuple[str, ...] = (),
) -> None:
    """One option per CLI field of ``cls`` (nested sections are not recursed: add them per group).

    ``only_when_given``: options without defaults (absent from the namespace unless typed), for
    fields that override a preset (the model flags over ``--arch``).
    """
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if not meta.get("cli", True) or f.name in skip or dataclasses.is_dataclass(hints[f.name]):
            continue
        kind, _ = _unwrap_optional(hints[f.name])
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        option = option_name(f.name)
        # Config help is plain prose; argparse reads "%" in help as a format directive.
        kwargs: dict[str, Any] = {"help": (meta.get("help") or "").replace("%", "%%") or None}
        if kind is not bool:
            kwargs["metavar"] = meta.get("metavar") or f.name.upper()
        if kind is bool:
            # A plain flag only turns a default off state on; a flag over a preset (only_when_given)
            # has both forms, since the preset may turn it on: --no-X turns it off.
            assert f.default is False or only_when_given, (
                f"{cls.__name__}.{f.name}: boolean options default to False"
            )
            kwargs.update(
                action=argparse.BooleanOptionalAction
            ) if only_when_given else kwargs.update(action="store_true")
        elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            kwargs["type"] = _comma_list(args[0], option)
        elif origin is tuple:
            kwargs.update(type=args[0], nargs=len(args))
        elif origin is list:
            kwargs.update(type=_comma_list(args[0], option), action="extend")
        else:
            kwargs["type"] = kind
            if meta.get("choices"):
                kwargs.update(
                    choices=meta["choices"], metavar="{" + ",".join(map(str, meta["choices"])) + "}"
                )
            if meta.get("const") is not None:
                kwargs.update(nargs="?", const=meta["const"])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        if meta.get("positional"):
            if not required:
                kwargs.update(nargs="?", default=f.default)
            action = parser.add_argument(dest_prefix + f.name, **kwargs)
        else:
            if only_when_given:
                kwargs["default"] = argparse.SUPPRESS
            elif origin is list:
                kwargs["default"] = None  # argparse would extend a default list in place
                kwargs["required"] = bool(meta.get("required"))
            elif required:
                kwargs["required"] = True
            else:
                kwargs["default"] = f.default
            action = parser.add_argument(
                option, *meta.get("aliases", ()), dest=dest_prefix + f.name, **kwargs
            )
        mark_path(action, meta.get("path"), separator=meta.get("path_separator"))


def mark_path(action: argparse.Action, kind: str | None, *, separator: str | None = None) -> None:
    """Declare that ``action``'s option names a path and what the command does there
    (``nmt.fileio.PATH_KINDS``): ``run_main`` passes every declared path through the output guard.
    Options that are not config fields declare theirs with this too."""
    if kind is None:
        return
    assert kind in PATH_KINDS, kind
    action.path_kind = kind  # type: ignore[attr-defined]
    action.path_separator = separator  # type: ignore[attr-defined]


def command_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[PathOption]:
    """Every path the command was given, with what it does there, from the options' declarations."""
    paths = []
    for action in parser._actions:
        kind = getattr(action, "path_kind", None)
        value = getattr(args, action.dest, None)
        if kind is None or value in (None, argparse.SUPPRESS):
            continue
        longest = max(action.option_strings, key=len, default=None)
        option = longest or str(action.metavar)
        separator = action.path_separator  # type: ignore[attr-defined]
        for item in value if isinstance(value, list | tuple) else [value]:
            for path in item.split(separator) if separator else [item]:
                if path:
                    paths.append(PathOption(option, path, kind))
    return paths


def config_values(cls: type, args: argparse.Namespace, *, dest_prefix: str = "") -> dict[str, Any]:
    """The values of ``cls``'s fields present in ``args`` (tuples for tuple fields, lists for lists)."""
    values = {}
    for f in dataclasses.fields(cls):
        key = dest_prefix + f.name
        if key in vars(args):
            value = vars(args)[key]
            if (
                isinstance(value, list)
                and typing.get_origin(_unwrap_optional(field_types(cls)[f.name])[0]) is tuple
            ):
                value = tuple(value)
            if value is None and typing.get_origin(field_types(cls)[f.name]) is list:
                value = []
            values[f.name] = value
    return values


def config_from_args(
    cls: type[T], args: argparse.Namespace, *, dest_prefix: str = "", **sections: Any
) -> T:
    """Build ``cls`` from the namespace; ``sections`` supplies nested section objects."""
    return cls(**config_values(cls, args, dest_prefix=dest_prefix), **sections)


def log_to_stderr(level: int = logging.INFO, *, rank: int | None = None) -> None:
    """The commands' one log line format, on stderr (each line names its rank under torchrun)."""
    rank_field = "" if rank is None else f"rank {rank} | "
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s | {rank_field}%(levelname)s | %(name)s | %(message)s",
        stream=sys.stderr,
    )


def run_main(
    prog: str,
    main: Callable[[], int],
    *,
    paths: list[PathOption],
    extra: tuple[type[BaseException], ...] = (),
) -> int:
    """The output guard over ``paths`` (``command_paths``), then ``main``; every user-facing
    failure as one line naming the file, line or option and the cause.

    ValueError is the toolkit's user error (bad option, bad data); OSError is reported with its path
    (disk full, permission denied...); ``extra`` are further exception types the command reports
    the same way. Anything else is a bug and keeps its traceback.
    """
    from nmt.fileio import check_written_paths, describe_os_error

    try:
        check_written_paths(paths)
        return main()
    except ValueError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
    except OSError as error:
        print(f"{prog}: error: {describe_os_error(error)}", file=sys.stderr)
    except extra as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
    except KeyboardInterrupt as error:  # Ctrl+C, or SIGTERM as nmt.workers.Terminated
        print(f"{prog}: {str(error) or 'interrupted'}", file=sys.stderr)
        # 130 (SIGINT) or 143 (SIGTERM): what a shell reports for a process the signal ended
        return 128 + getattr(error, "signum", signal.SIGINT)
    return 1
