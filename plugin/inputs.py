"""Parsers for untrusted option values: strict syntax, documented bounds, one-line refusals.

Each parser raises Invalid with a message that shows the offending value through show(), so a
refusal is always one printable line of bounded length, whatever bytes the value held.
No gRPC and no asyncio here: the configuration is checked before either is needed.
"""

from __future__ import annotations

import ipaddress
import re

MAX_SHOWN_CHARS = 60
# Any one-line message built from outside input (a refusal, a CDI problem) is cut to this.
MAX_LINE_CHARS = 400
# The kubelet's validation of an extended resource name (see the device manager facts):
# a qualified name whose prefix, with "requests." in front, is still a DNS-1123 subdomain.
REQUESTS_PREFIX = "requests."
NATIVE_MARKER = "kubernetes.io/"
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
_DNS1123_SUBDOMAIN = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")
# Plain ASCII decimals only: int() and float() would also take "1_000", " 5", "nan", "inf",
# "١٢" (Arabic-Indic digits) and hex floats, none of which belongs in a flag value.
_INTEGER = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
# Longer than any value within bounds could need: refused before it is converted.
MAX_NUMBER_CHARS = 32
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9]{0,61}[A-Za-z0-9])?")
_PORT = re.compile(r"[0-9]{1,5}")
MAX_PORT = 65535
# An API server URL: "https://", a 253-character host or a bracketed IPv6 address, ":65535",
# "/". Anything longer is refused before it is parsed.
MAX_URL_CHARS = 300
HTTPS = "https://"


class Invalid(ValueError):
    """A value refused; the message says why and shows the value, never the flag."""


def show(raw: str) -> str:
    """The value as a quoted, escaped literal (control characters visible), cut to a bound."""
    if len(raw) <= MAX_SHOWN_CHARS:
        return repr(raw)
    return f"{raw[:MAX_SHOWN_CHARS]!r}... ({len(raw)} characters)"


def printable(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """One line of at most about `limit` characters, unprintable characters escaped (\\n,
    \\x1b): for messages that quote what a user or a file supplied."""
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    if len(escaped) <= limit:
        return escaped
    return f"{escaped[:limit]}... ({len(text)} characters)"


def parse_int(raw: str, lo: int, hi: int) -> int:
    if not _INTEGER.fullmatch(raw):
        raise Invalid(f"{show(raw)} is not a whole number (digits 0-9 only)")
    if raw.startswith("-") and raw.strip("-0"):
        raise Invalid(f"{show(raw)} is below the minimum {lo}")
    if len(raw.lstrip("-0")) > len(str(hi)):
        raise Invalid(f"{show(raw)} is above the maximum {hi}")
    value = int(raw)
    if value < lo:
        raise Invalid(f"{value} is below the minimum {lo}")
    if value > hi:
        raise Invalid(f"{show(raw)} is above the maximum {hi}")
    return value


def parse_seconds(raw: str, lo: float, hi: float) -> float:
    """A finite duration in seconds within [lo, hi]; nan, inf and 1e308 never pass."""
    if raw.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
        raise Invalid(f"{show(raw)} is not a finite number of seconds")
    if len(raw) > MAX_NUMBER_CHARS or not _DECIMAL.fullmatch(raw):
        raise Invalid(
            f"{show(raw)} is not a number of seconds "
            f"(like 0.5, 2 or 1e-2, at most {MAX_NUMBER_CHARS} characters)"
        )
    # The syntax admits no nan; 1e999 overflows to inf, which the bounds below refuse.
    value = float(raw) + 0.0  # -0 is 0
    if value < lo:
        raise Invalid(f"{show(raw)} is below the minimum {lo:g}")
    if value > hi:
        raise Invalid(f"{show(raw)} is above the maximum {hi:g}")
    return value


def check_resource_name(name: str) -> str:
    """An extended resource name exactly as the kubelet's Register accepts it."""
    if name.count("/") != 1:
        raise Invalid(f"{show(name)} must be one DOMAIN/NAME (an extended resource name)")
    domain, _, short = name.partition("/")
    if NATIVE_MARKER in name:
        raise Invalid(
            f"{show(name)} is in the kubernetes.io namespace, reserved for native resources"
        )
    if name.startswith(REQUESTS_PREFIX):
        raise Invalid(f"{show(name)} starts with {REQUESTS_PREFIX!r}, reserved for quotas")
    if not domain or not _DNS1123_SUBDOMAIN.fullmatch(domain):
        raise Invalid(f"{show(name)}: the domain must be a lowercase DNS subdomain")
    if len(REQUESTS_PREFIX) + len(domain) > DNS1123_SUBDOMAIN_MAX:
        limit = DNS1123_SUBDOMAIN_MAX - len(REQUESTS_PREFIX)
        raise Invalid(f"{show(name)}: the domain is over {limit} characters")
    if not short or len(short) > QUALIFIED_NAME_MAX or not _QUALIFIED_NAME.fullmatch(short):
        raise Invalid(
            f"{show(name)}: the name after '/' must be 1-{QUALIFIED_NAME_MAX} letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit"
        )
    return name


def _check_host(host: str) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if (
        len(host) > DNS1123_SUBDOMAIN_MAX
        or not all(_HOST_LABEL.fullmatch(label) for label in labels)
        # All-digit last label: a mistyped IPv4 address such as 256.1.1.1, never a host name.
        or labels[-1].isdigit()
    ):
        raise Invalid(f"host {show(host)} is neither an IP address nor a valid host name")


def parse_host_port(raw: str, default_host: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT; an empty host means default_host; port 0 picks a free port."""
    if raw.startswith("["):
        inside, bracket, port = raw[1:].partition("]")
        if not bracket or not port.startswith(":"):
            raise Invalid(f"{show(raw)} must be [IPV6]:PORT")
        host, port = inside, port[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise Invalid(f"{show(host)} in brackets is not an IPv6 address") from None
    else:
        host, colon, port = raw.rpartition(":")
        if not colon:
            raise Invalid(f"{show(raw)} must be HOST:PORT (for example 127.0.0.1:8080)")
        if ":" in host:
            raise Invalid(f"{show(raw)}: write an IPv6 address in brackets, [ADDRESS]:PORT")
        host = host or default_host
        _check_host(host)
    if not port:
        raise Invalid(f"{show(raw)} has no port after ':'")
    if not _PORT.fullmatch(port) or int(port) > MAX_PORT:
        raise Invalid(f"port {show(port)} is not a number in 0-{MAX_PORT} (0: any free port)")
    return host, int(port)


def _url_port(port: str, raw: str) -> None:
    if not port:
        raise Invalid(f"{show(raw)} has no port after ':'")
    if not _PORT.fullmatch(port) or not 0 < int(port) <= MAX_PORT:
        raise Invalid(f"port {show(port)} is not a number in 1-{MAX_PORT}")


def parse_https_url(raw: str) -> str:
    """An API server's URL, exactly https://HOST[:PORT][/]: HOST a DNS name, an IPv4 address or
    a bracketed IPv6 address; no credentials, path, query or fragment, which a client would
    drop or misuse. The value is returned as given."""
    if len(raw) > MAX_URL_CHARS:
        raise Invalid(f"{show(raw)} is longer than {MAX_URL_CHARS} characters")
    if not raw.isascii() or any(c <= " " or c == "\x7f" for c in raw):
        raise Invalid(f"{show(raw)} holds a space, a control character or a non-ASCII character")
    if not raw.startswith(HTTPS):
        raise Invalid(f"{show(raw)} must be an https:// URL")
    rest = raw[len(HTTPS) :]
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:  # never echoed: the part before '@' may be a password
        raise Invalid(
            "credentials in the URL (USER@HOST) are refused: use --kube-token-file or "
            "--kube-client-cert"
        )
    for mark, part in (("?", "a query"), ("#", "a fragment")):
        if mark in tail:
            raise Invalid(f"{show(raw)} has {part}; give only https://HOST[:PORT]")
    if tail not in ("", "/"):
        raise Invalid(f"{show(raw)} has a path; give only https://HOST[:PORT]")
    if authority.startswith("["):
        inside, bracket, port = authority[1:].partition("]")
        try:
            if not bracket or "%" in inside:
                raise ValueError(inside)
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise Invalid(f"{show(raw)}: the host in brackets is not an IPv6 address") from None
        if port and not port.startswith(":"):
            raise Invalid(f"{show(raw)}: after the bracketed host only :PORT may follow")
        if port:
            _url_port(port[1:], raw)
        return raw
    host, colon, port = authority.partition(":")
    if ":" in port:
        raise Invalid(f"{show(raw)}: write an IPv6 address in brackets, https://[ADDRESS]:PORT")
    if not host:
        raise Invalid(f"{show(raw)} has no host")
    _check_host(host)
    if colon:
        _url_port(port, raw)
    return raw
