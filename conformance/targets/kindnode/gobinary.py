"""Which module release a Go binary was built from, read from the build information the Go
linker embeds (Go 1.18 and later; what `go version -m BINARY` prints), with no Go toolchain.

The suite image records each pinned tool's version from its binary, not from a name or a flag:
`helm version --short` of a `go install`ed helm says "v4.3" and crictl says "unknown", while the
build information names the module and its exact version.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"\xff Go buildinf:"
HEADER = 32  # magic, pointer size, flags, padding
INLINE = 0x2  # flags: the version strings follow the header (Go 1.18+)
SENTINEL = 16  # modinfo starts and ends with 16 bytes of marker


class NotGoBinary(ValueError):
    """No build information a supported Go release writes."""


@dataclass(frozen=True)
class GoBuild:
    go: str  # the toolchain, e.g. go1.26.8
    package: str  # the main package, e.g. sigs.k8s.io/kind
    modules: dict[str, str]  # module path -> version: the main module's and its dependencies'

    def release(self) -> tuple[str, str]:
        """The module that provides the main package (the longest module path that is a prefix
        of the package's) and its version: (sigs.k8s.io/cri-tools, v1.37.0) for crictl."""
        owners = [m for m in self.modules if self.package == m or self.package.startswith(m + "/")]
        if not owners:
            raise NotGoBinary(f"no module provides {self.package}")
        module = max(owners, key=len)
        return module, self.modules[module]


def _uvarint(data: bytes | mmap.mmap, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise NotGoBinary("a malformed length in the build information")


def parse(data: bytes | mmap.mmap) -> GoBuild:
    """The build information of a binary's bytes."""
    at = data.find(MAGIC)
    while at >= 0 and at % 16:  # the header is 16-byte aligned; other hits are data
        at = data.find(MAGIC, at + 1)
    if at < 0:
        raise NotGoBinary("no Go build information (not a Go binary)")
    if not data[at + 15] & INLINE:
        raise NotGoBinary("build information of a Go release before 1.18")
    strings = []
    cursor = at + HEADER
    for _ in range(2):
        size, cursor = _uvarint(data, cursor)
        strings.append(bytes(data[cursor : cursor + size]).decode("utf-8", "replace"))
        cursor += size
    go, modinfo = strings
    if len(modinfo) >= 2 * SENTINEL:
        modinfo = modinfo[SENTINEL:-SENTINEL]
    package, modules = "", {}
    for line in modinfo.splitlines():
        fields = line.split("\t")
        if fields[0] == "path" and len(fields) > 1:
            package = fields[1]
        elif fields[0] in ("mod", "dep") and len(fields) > 2:
            modules[fields[1]] = fields[2]
    if not package:
        raise NotGoBinary("build information without a main package")
    return GoBuild(go, package, modules)


def read(binary: Path) -> GoBuild:
    """The build information of the binary at `binary` (mapped, not read into memory)."""
    with binary.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return parse(data)
