"""setuptools' PEP 517 build backend, with an sdist that holds the sources and nothing else.

setuptools always adds its ``*.egg-info/`` directory and a generated ``setup.cfg`` to an sdist; a
build from the sdist regenerates both from ``pyproject.toml``, so they are dropped here (the sdist's
``PKG-INFO`` stays: it is the standard metadata). Everything else is setuptools' own hooks.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every other hook, unchanged)


def _unwanted(member_name: str) -> bool:
    parts = member_name.split("/")
    # parts[0] is the sdist's top directory, nmt-VERSION
    return len(parts) > 1 and (parts[1].endswith(".egg-info") or parts[1:] == ["setup.cfg"])


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    name = _setuptools.build_sdist(sdist_directory, config_settings)
    path = os.path.join(sdist_directory, name)
    kept = io.BytesIO()
    with (
        tarfile.open(path, "r:gz") as source,
        tarfile.open(fileobj=kept, mode="w", format=source.format) as target,
    ):
        for member in source.getmembers():
            if not _unwanted(member.name):
                target.addfile(member, source.extractfile(member) if member.isfile() else None)
    with (
        open(path, "wb") as handle,
        gzip.GzipFile(fileobj=handle, mode="wb", mtime=0, filename="") as compressed,
    ):
        compressed.write(kept.getvalue())
    return name
