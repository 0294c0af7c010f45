"""What an image of the suite was built from: the source commit and each pinned tool's version.

The suite's image (hvconform.targets.kindnode.suite_image, images/suite/Dockerfile) carries a
JSON file of this shape and names it in HVCONFORM_BUILD_INFO; `hvconform --version` prints it.
Outside such an image there is no file: the version is the installed package's and the commit
the checkout's, as best known.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

ENV = "HVCONFORM_BUILD_INFO"
FILE = "/opt/hvconform/build-info.json"  # where the image puts it (and names it in ENV)
SCHEMA = 1


@dataclass(frozen=True)
class Tool:
    name: str  # helm, kind, kubectl, crictl
    version: str  # the release its binary was built from, e.g. v4.3.2
    module: str  # the Go module of that release, e.g. helm.sh/helm/v4
    go: str  # the toolchain it was built with


@dataclass(frozen=True)
class BuildInfo:
    commit: str
    tools: tuple[Tool, ...]

    def to_json(self) -> str:
        tools = [vars(t) for t in self.tools]
        return json.dumps({"schema": SCHEMA, "commit": self.commit, "tools": tools}, indent=1)

    def lines(self) -> list[str]:
        """One line per tool, aligned: `  helm     v4.3.2  (helm.sh/helm/v4, go1.26.8)`."""
        name = max((len(t.name) for t in self.tools), default=0)
        version = max((len(t.version) for t in self.tools), default=0)
        return [f"  {t.name:<{name}}  {t.version:<{version}}  ({t.module}, {t.go})"
                for t in self.tools]  # fmt: skip


class BuildInfoError(ValueError):
    """HVCONFORM_BUILD_INFO names a file that is not build information."""


def parse(text: str) -> BuildInfo:
    try:
        data = json.loads(text)
        if data["schema"] != SCHEMA:
            raise BuildInfoError(f"schema {data['schema']!r}, not {SCHEMA}")
        tools = tuple(Tool(**{k: str(t[k]) for k in ("name", "version", "module", "go")})
                      for t in data["tools"])  # fmt: skip
        return BuildInfo(str(data["commit"]), tools)
    except (ValueError, KeyError, TypeError) as exc:
        raise BuildInfoError(f"not build information: {exc}") from None


def current(environ: dict[str, str] | None = None) -> BuildInfo | None:
    """The image's build information (HVCONFORM_BUILD_INFO), or None outside an image. A named
    file that is missing or unreadable is an error: the image is broken, not absent."""
    path = (os.environ if environ is None else environ).get(ENV, "")
    if not path:
        return None
    try:
        return parse(Path(path).read_text())
    except OSError as exc:
        raise BuildInfoError(f"{ENV}={path}: {exc.strerror or exc}") from None
    except BuildInfoError as exc:
        raise BuildInfoError(f"{ENV}={path}: {exc}") from None
