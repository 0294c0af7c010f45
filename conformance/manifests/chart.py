"""The Helm chart (charts/hv-device-plugin) as the one source of the plugin's manifests.

`helm template` renders it; `hvconform manifests` and the cluster targets call it through
`template()`. helm is a Go program built from its module (`nox -s tests` and `nox -s helm` put
it next to the session's python); HV_HELM names another one.

A chart and its values files may be a profile's, so nothing helm reads is taken on trust:
- the chart is copied into a private directory first and helm renders the copy: a symlink or a
  special file anywhere in the chart is refused, as are more than MAX_CHART_FILES entries or
  MAX_CHART_BYTES in all (`.Files.Get "files/shadow"` with files/shadow -> /etc/shadow would
  put the host's secret into a ConfigMap);
- each values file must be a regular file (not a symlink: one to a kubeconfig would be
  rendered) of at most MAX_FILE_BYTES that the strict YAML loader accepts (no aliases, no
  duplicate keys); helm reads the copy that was checked, so it cannot change in between;
- helm's output is read through a pipe and capped at MAX_RUN_BYTES (helm is killed past it),
  the cap of one run's manifests, and it takes at most HELM_TIMEOUT_S.
What helm renders and what a profile's manifest files hold are then read alike (`load_objects`):
the strict YAML loader within one run's Budget, every document a Kubernetes object with a name
(or a generateName) the API server and the suite's own client accept.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

from hvconform.contract import settings
from hvconform.contract.datafiles import data_root
from hvconform.contract.preconditions import Found, Requirement, ask
from hvconform.contract.safeyaml import (
    MAX_FILE_BYTES,
    MAX_RUN_BYTES,
    Budget,
    UnsafeInput,
    excerpt,
    load_strict,
    load_strict_all,
    read_bounded,
)

# One release name: no object name depends on it, so any name renders the same objects.
RELEASE: Final = "hv-device-plugin"
CHART_NAME: Final = "hv-device-plugin"
HELM_TIMEOUT_S: Final = 60.0
# A chart: this repository's has 21 entries and 70 KB; a chart with CRDs a few hundred KB.
MAX_CHART_FILES: Final = 1000
MAX_CHART_BYTES: Final = 16 * 1024 * 1024
# helm's stderr kept for its one-line reason; the rest is read and dropped so helm never blocks.
MAX_HELM_STDERR: Final = 64 * 1024


class ChartError(RuntimeError):
    """helm or the chart is missing, or helm refused the values (one line, helm's reason)."""


def chart_dir() -> Path:
    """charts/hv-device-plugin as the package ships it (the wheel's copy, or the checkout's:
    hvconform.contract.datafiles), or HV_CHART."""
    override = settings.current().chart
    path = Path(override) if override else data_root() / "charts" / CHART_NAME
    if not (path / "Chart.yaml").is_file():
        raise ChartError(
            f"chart not found at {path}: the installed hv-device-plugin lacks its data "
            "(reinstall the wheel), or set HV_CHART to the chart's directory"
        )
    return path


def target_values(target: str) -> Path:
    """The values file of one target (charts/hv-device-plugin/targets/<target>.yaml)."""
    return chart_dir() / "targets" / f"{target}.yaml"


class HelmMissing(ChartError):
    """No helm to run: an environment problem (exit 6 with the fix), not bad input."""


def helm_cache() -> Path:
    """Where `nox -s helm` puts the pinned helm for everyone on this machine (not a venv)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hv-device-plugin" / "bin" / "helm"


def helm_binary() -> str:
    """HV_HELM, else the helm next to this interpreter (a nox session's), else PATH's, else the
    one `nox -s helm` built into the user's cache."""
    override = settings.current().helm
    if override:
        return override
    beside = Path(sys.executable).parent / "helm"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("helm")
    if found is not None:
        return found
    cached = helm_cache()
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    raise HelmMissing(
        f"helm not found: `./dev nox -s helm` builds the pinned one into {cached}, or set HV_HELM"
    )


def helm_requirement(feature: str, fix: str) -> Requirement:
    """The precondition of a run that renders the chart: a helm that answers `version`."""

    def probe() -> Found:
        try:
            binary = helm_binary()
        except ChartError as exc:
            return Found(f"missing ({exc})", False, "helm_binary()")
        line, shown = ask([binary, "version", "--short"])
        return Found(line or "unusable", line is not None, shown)

    return Requirement("helm", feature, "a working helm (v4)", fix, probe)


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return "; ".join(lines) or "no output"


def _drain(proc: subprocess.Popen[bytes], verb: str, cap: int) -> tuple[bytes, bytes]:
    """helm's stdout (at most `cap` bytes) and the start of its stderr, both read as they come
    so neither pipe fills; ChartError past the cap or the deadline (the caller kills helm)."""
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes
    deadline = time.monotonic() + HELM_TIMEOUT_S
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChartError(f"helm {verb} took longer than {HELM_TIMEOUT_S:g}s")
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.data is out:
                    out += chunk
                    if len(out) > cap:
                        raise ChartError(
                            f"helm {verb}: output larger than {cap} bytes (the cap of one run's "
                            "manifests, MAX_RUN_BYTES); helm was stopped"
                        )
                else:
                    err += chunk[: max(0, MAX_HELM_STDERR - len(err))]
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        raise ChartError(f"helm {verb} took longer than {HELM_TIMEOUT_S:g}s") from None
    return bytes(out), bytes(err)


def helm(args: Sequence[str], *, stdin: str | None = None, max_output: int = MAX_RUN_BYTES) -> str:
    """Run helm; its stdout (at most max_output bytes), or ChartError with helm's own words on
    one line. Never buffers more than the cap: past it helm is killed."""
    argv = [helm_binary(), *args]
    with tempfile.TemporaryFile() as feed:
        if stdin is not None:
            feed.write(stdin.encode("utf-8"))
            feed.seek(0)
        source: IO[bytes] | int = feed if stdin is not None else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                argv, stdin=source, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except FileNotFoundError:
            raise HelmMissing(
                f"helm not found at {argv[0]}: `./dev nox -s helm` builds the pinned one"
            ) from None
        with proc:
            try:
                out, err = _drain(proc, args[0], max_output)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    if proc.returncode != 0:
        said = (err or out).decode("utf-8", "replace")
        raise ChartError(f"helm {args[0]}: {_one_line(said)}")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChartError(f"helm {args[0]}: output is not UTF-8 (byte {exc.start})") from None


def _copy_chart(chart: Path, dest: Path) -> Path:
    """A private copy of `chart` under `dest` for helm to render; ChartError (one line naming
    the path) for a symlink or a special file in it, or a chart past MAX_CHART_FILES entries or
    MAX_CHART_BYTES."""
    root = chart.resolve()
    if not root.is_dir():
        raise ChartError(f"chart {excerpt(str(chart), 160)}: not a directory")
    copy = dest / (root.name or "chart")
    entries, total = 0, 0
    pending = [(root, copy)]
    while pending:
        here, there = pending.pop()
        there.mkdir(mode=0o700)
        with os.scandir(here) as listing:  # scandir never follows a link
            for entry in listing:
                path = Path(entry.path)
                shown = excerpt(str(path), 160)
                entries += 1
                if entries > MAX_CHART_FILES:
                    raise ChartError(f"chart {root}: more than {MAX_CHART_FILES} files")
                if entry.is_symlink():
                    raise ChartError(
                        f"chart {root}: {shown} is a symlink, refused: a template could read "
                        "what it points to (.Files.Get); copy the file into the chart instead"
                    )
                if entry.is_dir(follow_symlinks=False):
                    pending.append((path, there / entry.name))
                    continue
                if not entry.is_file(follow_symlinks=False):
                    raise ChartError(f"chart {root}: {shown} is not a regular file")
                try:
                    data = read_bounded(path, MAX_CHART_BYTES - total, follow=False)
                except UnsafeInput as exc:
                    raise ChartError(
                        f"chart {root}: {exc} (at most {MAX_CHART_BYTES} bytes in all)"
                    ) from None
                total += len(data)
                (there / entry.name).write_bytes(data)
    return copy


def _copy_values(path: Path, dest: Path) -> Path:
    """A checked copy of one values file: a regular file, not a symlink, at most MAX_FILE_BYTES,
    one YAML mapping the strict loader accepts; ChartError (one line) otherwise."""
    try:
        data = read_bounded(path, MAX_FILE_BYTES, follow=False)
    except UnsafeInput as exc:
        raise ChartError(f"values file {exc}") from None
    try:
        values = load_strict(data, f"values file {excerpt(str(path), 160)}")
    except UnsafeInput as exc:
        raise ChartError(str(exc)) from None
    if not isinstance(values, dict | None):
        raise ChartError(f"values file {excerpt(str(path), 160)}: not a mapping of values")
    dest.write_bytes(data)
    return dest


def template(
    namespace: str,
    values_files: Sequence[Path] = (),
    values: Mapping[str, Any] | None = None,
    *,
    chart: Path | None = None,
) -> str:
    """`helm template` of the chart: the files in order, then `values` on top (stdin). The
    chart and the files are checked and copied first (see the module's rules)."""
    with tempfile.TemporaryDirectory(prefix="hv-chart-") as work:
        staged = _copy_chart(chart or chart_dir(), Path(work))
        args = ["template", RELEASE, str(staged), "--namespace", namespace]
        for index, path in enumerate(values_files):
            copy = _copy_values(Path(path), Path(work) / f"values-{index}.yaml")
            args += ["--values", str(copy)]
        if not values:
            return helm(args)
        return helm([*args, "--values", "-"], stdin=json.dumps(values))


# An object name: a DNS-1123 subdomain of at most 253 characters (what most kinds accept; never
# ".", "..", "/" or "%", which would make a request path name another object or a collection).
_SUBDOMAIN: Final = re.compile(
    r"(?=.{1,253}$)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)
# RBAC objects may also hold capitals, "_" and ":" (system:... roles): Kubernetes validates
# their names as path segments; this is the part of that rule the suite's client puts in a URL.
_RBAC_NAME: Final = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.:]{0,251}[A-Za-z0-9])?")
_RBAC_GROUP: Final = "rbac.authorization.k8s.io/"
# generateName: the server appends 5 random characters, and the whole must be a name.
MAX_GENERATE_NAME: Final = 253 - 5


class ObjectError(ValueError):
    """Manifests that are not Kubernetes objects the suite can apply (one line: where, which)."""


def _name_problem(name: str, obj: Mapping[str, Any]) -> str | None:
    rbac = str(obj["apiVersion"]).startswith(_RBAC_GROUP)
    if _SUBDOMAIN.fullmatch(name) or (rbac and _RBAC_NAME.fullmatch(name)):
        return None
    return (
        f"metadata.name {excerpt(name)} is not an object name (a DNS-1123 subdomain: "
        "lowercase letters, digits, '-' and '.', at most 253 characters)"
    )


def _prefix_problem(prefix: str) -> str | None:
    # The API server masks one trailing "-" (generateName: app-) before it checks the prefix.
    masked = prefix[:-1] + "a" if prefix.endswith("-") else prefix
    if len(prefix) <= MAX_GENERATE_NAME and _SUBDOMAIN.fullmatch(masked):
        return None
    return (
        f"metadata.generateName {excerpt(prefix)} is not a name prefix (DNS-1123 subdomain "
        f"characters, at most {MAX_GENERATE_NAME})"
    )


def object_problem(obj: Any) -> str | None:
    """Why one parsed document is not a Kubernetes object the suite can apply, or None."""
    if not isinstance(obj, dict):
        return f"not a mapping but {type(obj).__name__}"
    for key in ("apiVersion", "kind"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            return f"{key} is not a non-empty string"
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return "metadata is not a mapping"
    name, prefix = meta.get("name"), meta.get("generateName")
    for field, value in (("name", name), ("generateName", prefix)):
        if value is not None and not isinstance(value, str):
            return f"metadata.{field} is not a string"
    if not name and not prefix:
        return "no metadata.name and no metadata.generateName"
    return (_name_problem(name, obj) if name else None) or (
        _prefix_problem(prefix) if prefix else None
    )


def load_objects(
    text: str | bytes, where: str, budget: Budget | None = None
) -> list[dict[str, Any]]:
    """The Kubernetes objects of a YAML stream (helm's output or a manifest file), read by the
    strict loader within `budget` (one run's: pass the same one for every file of a run);
    ObjectError, one line naming `where`, the object and the rule, otherwise."""
    try:
        objects = load_strict_all(text, where, budget)
    except UnsafeInput as exc:
        raise ObjectError(str(exc)) from None
    checked: list[dict[str, Any]] = []
    for index, obj in enumerate(objects, 1):
        problem = object_problem(obj)
        if problem is not None:
            kind = obj.get("kind") if isinstance(obj, dict) else None
            which = f"object {index}" + (f" ({excerpt(kind)})" if isinstance(kind, str) else "")
            raise ObjectError(f"{where}: {which}: {problem}")
        checked.append(obj)
    return checked
