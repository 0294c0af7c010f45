"""Image references, defined once for the whole suite: the grammar of distribution/reference.

    reference  := name [ ":" tag ] [ "@" digest ]
    name       := [ domain "/" ] path            at most 255 characters (NameTotalLengthMax)
    domain     := host [ ":" port ]              host: a DNS name, an IPv4 address or [IPv6]
    path       := component ( "/" component )*   component: [a-z0-9]+ joined by . _ __ or -+
    tag        := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest     := algorithm ":" hex              sha256: 64, sha384: 96, sha512: 128 hex digits

The first part of a name is its registry (domain) when it holds a '.' or a ':', is
`localhost`, has an upper-case letter or is a bracketed IPv6 address, as Docker and containerd
read it; else it is the first path component. Every profile value and flag that names an image
goes through `parse`, so a newline, an escape sequence or a 10 KB name never reaches a plan, a
`docker build` or a manifest. A "pinned" reference has a tag other than latest, or a digest
(and no latest tag beside it): kind never re-pulls a mutable tag, and a node would pull another
image than the one tested.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

NAME_MAX: Final = 255  # distribution's NameTotalLengthMax: domain and path together
TAG_MAX: Final = 128
# Digest algorithms a registry verifies, with the length of their lowercase hex encoding.
DIGEST_HEX: Final = {"sha256": 64, "sha384": 96, "sha512": 128}
# Nothing valid is longer: a name, ':' and a tag, '@' and the longest digest.
REFERENCE_MAX: Final = NAME_MAX + 1 + TAG_MAX + 1 + len("sha512:") + DIGEST_HEX["sha512"]
MAX_PORT: Final = 65535
SHOWN: Final = 120  # characters of a refused reference quoted in a message

_COMPONENT: Final = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*", re.ASCII)
_HOST_LABEL: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)
_IPV6: Final = re.compile(r"[0-9A-Fa-f:]+", re.ASCII)  # no zone (%eth0), no embedded IPv4
_PORT: Final = re.compile(r"[0-9]{1,5}", re.ASCII)
_TAG: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)
_ALGORITHM: Final = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*", re.ASCII)
_HEX: Final = re.compile(r"[0-9a-f]+", re.ASCII)


class ImageRefError(ValueError):
    """A reference that is not one (or not pinned, when that was asked); one line, the
    reference quoted escaped and cut to SHOWN characters."""


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference, exactly as written (no docker.io/library/ added)."""

    domain: str  # registry host[:port]; "" when the name has none
    path: str  # the repository path inside the registry
    tag: str = ""  # "" when none
    digest: str = ""  # "algorithm:hex", "" when none

    @property
    def name(self) -> str:
        """The repository: domain and path (the chart's image.repository)."""
        return f"{self.domain}/{self.path}" if self.domain else self.path

    @property
    def pinned(self) -> bool:
        """A digest, or a tag other than latest (any case). A latest tag is refused even beside a
        digest: the chart's schema never takes it, and it reads as "whatever latest is now"."""
        return self.tag.lower() != "latest" and bool(self.digest or self.tag)

    def __str__(self) -> str:
        return (
            self.name
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )


def shown(ref: str) -> str:
    """The reference as an escaped literal of bounded length: never a second line or a control
    sequence, whatever it holds."""
    text = repr(ref)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(ref)} characters)"


def _short(part: str) -> str:
    return repr(part) if len(part) <= 40 else f"{part[:40]!r}..."


def _check_host(host: str) -> None:
    if host.startswith("["):
        inside = host[1:-1] if host.endswith("]") else ""
        try:
            if not _IPV6.fullmatch(inside):
                raise ValueError(inside)
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise ImageRefError(
                f"registry host {_short(host)} is not a bracketed IPv6 address"
            ) from None
        return
    labels = host.split(".")
    if not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise ImageRefError(
            f"registry host {_short(host)} is not a DNS name or an IPv4 address (labels of "
            "letters, digits and '-', at most 63 characters, joined by '.')"
        )
    if labels[-1].isdigit():  # all digits: meant as an IPv4 address, so it must be one
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ImageRefError(f"registry host {_short(host)} is not an IPv4 address") from None


def _check_domain(domain: str) -> None:
    if domain.startswith("["):
        host, bracket, rest = domain.partition("]")
        host += bracket
    else:
        host, colon, rest = domain.partition(":")
        rest = colon + rest
    _check_host(host)
    if rest:
        port = rest[1:]
        if not rest.startswith(":") or not _PORT.fullmatch(port) or not 0 < int(port) <= MAX_PORT:
            raise ImageRefError(
                f"registry {_short(domain)}: the port must be a number in 1-{MAX_PORT}"
            )


def _split_domain(name: str) -> tuple[str, str]:
    first, slash, rest = name.partition("/")
    is_domain = "." in first or ":" in first or first == "localhost" or first != first.lower()
    if slash and is_domain:
        return first, rest
    return "", name


def _check_digest(digest: str) -> None:
    algorithm, colon, encoded = digest.partition(":")
    if not colon or not _ALGORITHM.fullmatch(algorithm):
        raise ImageRefError(f"digest {_short(digest)} is not algorithm:hex (sha256:<64 hex>)")
    want = DIGEST_HEX.get(algorithm)
    if want is None:
        raise ImageRefError(
            f"digest algorithm {_short(algorithm)} is not one of {', '.join(DIGEST_HEX)}"
        )
    if len(encoded) != want or not _HEX.fullmatch(encoded):
        raise ImageRefError(f"a {algorithm} digest is {want} lowercase hex digits")


def _parse(ref: str) -> ImageRef:
    if not ref:
        raise ImageRefError("empty")
    if len(ref) > REFERENCE_MAX:
        raise ImageRefError(f"longer than any reference can be ({REFERENCE_MAX} characters)")
    if not ref.isprintable() or not ref.isascii() or " " in ref:
        raise ImageRefError("holds a space, a control character or a non-ASCII character")
    rest, at, digest = ref.partition("@")
    if at:
        _check_digest(digest)
    name, tag = rest, ""
    colon = rest.rfind(":")
    if colon > rest.rfind("/"):  # a ':' after the last '/' starts the tag; before it, a port
        name, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise ImageRefError(
                f"tag {_short(tag)} is not 1-{TAG_MAX} letters, digits, '_', '.' or '-' "
                "(not starting with '.' or '-')"
            )
    if not name:
        raise ImageRefError("no repository name")
    if len(name) > NAME_MAX:
        raise ImageRefError(f"the name is {len(name)} characters, more than {NAME_MAX}")
    domain, path = _split_domain(name)
    if domain:
        _check_domain(domain)
    for component in path.split("/"):
        if not _COMPONENT.fullmatch(component):
            raise ImageRefError(
                f"path component {_short(component)} is not lowercase letters and digits "
                "joined by '.', '_', '__' or '-'"
            )
    return ImageRef(domain, path, tag, digest)


def parse(ref: str, *, pinned: bool = False) -> ImageRef:
    """The reference's parts; ImageRefError (one line, `ref` quoted) when it is not one, or,
    with `pinned`, when it names no fixed image (no tag, latest, and no digest)."""
    try:
        image = _parse(ref)
    except ImageRefError as exc:
        raise ImageRefError(f"{shown(ref)} is not an image reference: {exc}") from None
    if pinned and not image.pinned:
        why = "':latest' is mutable" if image.tag else "no tag means ':latest'"
        raise ImageRefError(
            f"{shown(ref)} is not pinned: {why}; give an explicit tag other than latest, "
            "or a digest (@sha256:...)"
        )
    return image


def problem(ref: str, *, pinned: bool = False) -> str | None:
    """Why `ref` cannot be used (see `parse`), or None."""
    try:
        parse(ref, pinned=pinned)
    except ImageRefError as exc:
        return str(exc)
    return None
