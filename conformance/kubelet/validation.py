"""Registration rules and error texts of the kubelet device manager, reproduced exactly.

Every message here is built the way the kubelet builds it in Go, so a plugin (or a test)
sees the same bytes it would see from a real node.
"""

from __future__ import annotations

import posixpath
import re

import grpc

from hv_device_plugin.api.wire import API_VERSION, KUBELET_SOCKET

SUPPORTED_VERSION = API_VERSION
# The kubelet formats its SupportedVersions array (`[...]string{"v1beta1"}`) with %q, which
# renders as ["v1beta1"]; keep that rendering so the message matches byte for byte.
SUPPORTED_VERSIONS = (SUPPORTED_VERSION,)
CHECKPOINT_NAME = "kubelet_internal_checkpoint"
KUBELET_SOCKET_NAME = KUBELET_SOCKET
DEPRECATION_NAME = "DEPRECATION"
PRESTART_TIMEOUT_S = 30.0

_REQUESTS_PREFIX = "requests."
_NATIVE_NAMESPACE = "kubernetes.io/"
_QUALIFIED_NAME_MAX = 63
_DNS1123_SUBDOMAIN_MAX = 253
_QUALIFIED_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_RE = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")

# Go's codes.Code.String(): CamelCase, with the two spellings that differ from Python's names.
_GO_CODE_NAMES = {grpc.StatusCode.OK: "OK", grpc.StatusCode.CANCELLED: "Canceled"}

_GO_ESCAPES = {
    "\a": r"\a",
    "\b": r"\b",
    "\f": r"\f",
    "\n": r"\n",
    "\r": r"\r",
    "\t": r"\t",
    "\v": r"\v",
    "\\": "\\\\",
    '"': '\\"',
}


def go_quote(value: str) -> str:
    """Render `value` like Go's %q verb (strconv.Quote)."""
    out: list[str] = ['"']
    for ch in value:
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def version_error(version: str) -> str | None:
    """The kubelet's error for an unsupported API version, or None when supported."""
    if version in SUPPORTED_VERSIONS:
        return None
    supported = "[" + " ".join(go_quote(v) for v in SUPPORTED_VERSIONS) + "]"
    return (
        f"requested API version {go_quote(version)} is not supported by kubelet. "
        f"Supported version is {supported}"
    )


def _is_dns1123_subdomain(value: str) -> bool:
    return (
        len(value) <= _DNS1123_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN_RE.fullmatch(value) is not None
    )


def _is_qualified_name(value: str) -> bool:
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix or not _is_dns1123_subdomain(prefix):
            return False
    else:
        return False
    return 0 < len(name) <= _QUALIFIED_NAME_MAX and _QUALIFIED_NAME_RE.fullmatch(name) is not None


def is_extended_resource_name(name: str) -> bool:
    """v1helper.IsExtendedResourceName: what the kubelet accepts as a device plugin resource.

    The kubelet validates "requests." + name, so the domain part is effectively limited to
    253 - len("requests.") = 244 characters.
    """
    if "/" not in name or _NATIVE_NAMESPACE in name or name.startswith(_REQUESTS_PREFIX):
        return False
    return _is_qualified_name(_REQUESTS_PREFIX + name)


def resource_name_error(name: str) -> str | None:
    """The kubelet's error for an invalid resource name, or None when valid."""
    if is_extended_resource_name(name):
        return None
    return f"the ResourceName {go_quote(name)} is invalid"


def go_join(directory: str, endpoint: str) -> str:
    """Go's filepath.Join(dir, endpoint): an absolute or `..` endpoint stays under dir's rules."""
    joined = "/".join(part for part in (directory, endpoint) if part)
    if not joined:
        return ""
    cleaned = posixpath.normpath(joined)
    # POSIX normpath keeps a leading "//"; Go's Clean does not.
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    return cleaned


def go_code_name(code: grpc.StatusCode) -> str:
    """Go's name for a gRPC status code, e.g. DEADLINE_EXCEEDED -> DeadlineExceeded."""
    if code in _GO_CODE_NAMES:
        return _GO_CODE_NAMES[code]
    return "".join(word.capitalize() for word in code.name.split("_"))


def go_status_text(code: grpc.StatusCode, details: str | None) -> str:
    """How a Go gRPC client prints a status error: `rpc error: code = X desc = Y`."""
    return f"rpc error: code = {go_code_name(code)} desc = {details or ''}"


def rpc_error_text(err: grpc.RpcError) -> str:
    """go_status_text for a caught grpc error."""
    return go_status_text(err.code(), err.details())
