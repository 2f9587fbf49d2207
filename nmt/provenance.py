"""Provenance, once: what a run, a generated dataset or a set of shards is, and how two differ.

An option says which identity it belongs to where it is declared (``opt(identity=...)`` in
nmt.config: a part of a training run's identity, or ``"data"``, the identity of the data a command
generates); ``identity`` collects them from a config tree, keyed by the option the user types
(``--max-tokens``). Facts that are no option (a dataset's checksums, a model's SHA-256) join the
result as plain items. ``differences`` compares a recorded identity with the current one, one line
per differing item, and so serves resume, dataset generation, shard merging and the recipes alike.

Values compare as plain data: tuples as lists, mappings by key, an option's ``compare_as`` applied
(``en-de:2`` and ``en-de:2.0`` are the same --upsample-directions). Paths compare as written: a
path is a name, and where the content matters the identity holds its checksum as a fact.

An item that an old record lacks (the option is newer than the record) compares equal when the
current value is the option's default (``defaults``, given to ``differences`` as ``absent``): the
old code behaved as the default does, so old checkpoints still resume.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from nmt.config import IDENTITIES, field_types, option_name

ABSENT = "(none)"


def identity(config: Any, scope: str, *, declared_by: type | None = None) -> dict[str, Any]:
    """The options of ``config``'s dataclass tree that belong to ``scope``, by option name, with
    plain values. ``config`` is a config or its ``to_dict`` record (an old manifest's, with
    ``declared_by`` its class); ``declared_by`` also lends the declarations of a class to an object
    holding some of its fields (those it lacks are left out)."""
    _check_scope(scope)
    items: dict[str, Any] = {}
    for f, value in _declared(config, declared_by or type(config), scope):
        items[option_name(f.name)] = _comparable(f, value)
    return items


def defaults(cls: type, scope: str) -> dict[str, Any]:
    """Per option of ``scope`` in ``cls``'s tree: what a record lacking it means (its default)."""
    _check_scope(scope)
    items: dict[str, Any] = {}
    for f in _fields(cls, scope):
        if f.default is not dataclasses.MISSING:
            items[option_name(f.name)] = _comparable(f, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            items[option_name(f.name)] = _comparable(f, f.default_factory())
    return items


def differences(
    recorded: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    absent: Mapping[str, Any] | None = None,
    free: Collection[str] = (),
    labels: tuple[str, str] = ("when recorded", "now"),
) -> list[str]:
    """One line per item in which ``recorded`` and ``current`` differ, e.g.
    ``--max-tokens: 4096 in the checkpoint, 8192 now`` with ``labels`` ("in the checkpoint", "now").

    ``absent``: the value an item missing from ``recorded`` stands for (``defaults()``), so an
    option added since compares equal at its default. ``free``: items that may differ."""
    implied = absent or {}
    lines = []
    for item in sorted(set(recorded) | set(current)):
        if item in free:
            continue
        old = recorded[item] if item in recorded else implied.get(item, ABSENT)
        new = current.get(item, ABSENT)
        if plain(old) != plain(new):
            lines.append(f"{item}: {_shown(old)} {labels[0]}, {_shown(new)} {labels[1]}")
    return lines


def plain(value: Any) -> Any:
    """``value`` as JSON would give it back: tuples as lists, mappings with sorted string keys."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return value


def _shown(value: Any) -> str:
    return value if value is ABSENT else repr(value)


def _check_scope(scope: str) -> None:
    if scope not in IDENTITIES:
        raise AssertionError(f"{scope!r} is no identity ({', '.join(IDENTITIES)})")


def _comparable(f: dataclasses.Field, value: Any) -> Any:
    compare_as = f.metadata.get("compare_as")
    return plain(compare_as(value) if compare_as is not None else value)


def _fields(cls: type, scope: str) -> list[dataclasses.Field]:
    """The fields of ``cls``'s tree (nested configs included) that belong to ``scope``."""
    found = []
    types = field_types(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if dataclasses.is_dataclass(types[f.name]):
            found += _fields(types[f.name], scope)
        elif f.metadata.get("identity") == scope:
            found.append(f)
    return found


def _declared(config: Any, cls: type, scope: str) -> list[tuple[dataclasses.Field, Any]]:
    """(field, value) for the fields of ``cls``'s tree in ``scope`` that ``config`` holds."""
    found = []
    types = field_types(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if isinstance(config, Mapping):
            if f.name not in config:
                continue
            value = config[f.name]
        elif hasattr(config, f.name):
            value = getattr(config, f.name)
        else:
            continue
        if dataclasses.is_dataclass(types[f.name]):
            found += _declared(value, types[f.name], scope)
        elif f.metadata.get("identity") == scope:
            found.append((f, value))
    return found
