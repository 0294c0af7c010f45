"""The few Kubernetes API calls cluster targets make, over the official `kubernetes` client.

Objects are plain dicts, as rendered by hvconform.manifests: requests go through the client's
ApiClient (kubeconfig, TLS, auth) with a generic resource path, so no generated model class ever
rewrites a manifest. Exec uses the client's websocket stream. This is the seam tests replace the
API server behind (a recorded-contract server on 127.0.0.1), never the code above it.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from hvconform.contract.deploy import CLUSTER_SCOPED

Obj = dict[str, Any]

_PLURAL_EXCEPTIONS = {"Endpoints": "endpoints"}
# What a Kubernetes object name may be in a URL path segment (apimachinery's path-segment rule:
# never ".", "..", nor "/" or "%"; at most 253 characters); anything else is refused before a
# request exists, so no code path can turn a missing name into a collection path.
_NAME = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.:]{0,251}[A-Za-z0-9])?$")


class UnsafePath(ValueError):
    """A request path that would name more than one object (an empty or relative name)."""


@dataclass(frozen=True)
class ResourceInfo:
    """What the API server calls a kind: its plural, whether it lives in a namespace, and the
    verbs it serves; `source` says who said so ("discovery" or "table": the built-in fallback
    of a plan made before any cluster exists)."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool
    verbs: tuple[str, ...] = ()
    source: str = "table"

    def collection(self, namespace: str = "") -> str:
        """The collection (POST, list): never a DELETE target."""
        base = (
            f"/api/{self.api_version}"
            if "/" not in self.api_version
            else f"/apis/{self.api_version}"
        )
        if self.namespaced:
            if not namespace:
                return f"{base}/{self.plural}"  # every namespace: list only
            base += f"/namespaces/{_segment(namespace)}"
        return f"{base}/{self.plural}"

    def item(self, name: str, namespace: str = "") -> str:
        """One object's path; UnsafePath for a name that is not one object's."""
        if self.namespaced and not namespace:
            raise UnsafePath(f"{self.kind} {name!r:.80} is namespaced: no namespace given")
        return f"{self.collection(namespace)}/{_segment(name)}"


def _segment(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UnsafePath(f"{name!r:.80} is not an object name (a request would name a collection)")
    return urllib.parse.quote(name, safe="")


def table_resource(api_version: str, kind: str) -> ResourceInfo:
    """The built-in fallback (no server to ask): scope from CLUSTER_SCOPED, the plural by
    English rule; a plan built from it says so, and a real run asks discovery instead."""
    return ResourceInfo(api_version, kind, plural(kind), kind not in CLUSTER_SCOPED)


class ApiError(Exception):
    """A non-2xx answer: status, reason and the Status message the server gave."""

    def __init__(self, status: int, reason: str, message: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body


@dataclass
class ExecResult:
    rc: int
    stdout: bytes
    stderr: bytes


def plural(kind: str) -> str:
    if kind in _PLURAL_EXCEPTIONS:
        return _PLURAL_EXCEPTIONS[kind]
    lower = kind.lower()
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    if lower.endswith(("s", "x")):
        return lower + "es"
    return lower + "s"


def resource_path(api_version: str, kind: str, namespace: str = "", name: str = "") -> str:
    """A path from the built-in table (plans, well-known kinds): the collection without a name,
    one object with one (UnsafePath for a name that is not one)."""
    info = table_resource(api_version, kind)
    if not info.namespaced:
        namespace = ""
    return info.item(name, namespace) if name else info.collection(namespace)


def object_path(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    return resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def describe(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace", "")
    return f"{obj['kind']} {ns + '/' if ns else ''}{meta.get('name', '?')}"


class KubeApi:
    """Dict-in, dict-out access to one cluster through a kubeconfig."""

    def __init__(self, kubeconfig: str, request_timeout: float = 30.0, context: str = "") -> None:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig,
            context=context or None,
            client_configuration=configuration,
        )
        self.client = client.ApiClient(configuration)
        self.timeout = request_timeout
        self.kubeconfig = kubeconfig
        # Labels every object this client creates carries (the run's label: cleanup lists by it)
        self.stamp: dict[str, str] = {}
        self._resources: dict[tuple[str, str], ResourceInfo] = {}
        self._discovery: Any = None
        self._discovery_dir = ""

    def close(self) -> None:
        if self._discovery_dir:
            shutil.rmtree(self._discovery_dir, ignore_errors=True)
            self._discovery_dir = ""
        self.client.close()  # type: ignore[no-untyped-call]

    # -- discovery ------------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> ResourceInfo:
        """The cluster's own word on a kind (the client's discovery, CRDs included): plural,
        scope and verbs. ApiError 404 when the cluster serves no such kind."""
        key = (api_version, kind)
        if key not in self._resources:
            self._resources[key] = self._discover(api_version, kind)
        return self._resources[key]

    def _discover(self, api_version: str, kind: str) -> ResourceInfo:
        from kubernetes.dynamic import DynamicClient
        from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError

        try:
            if self._discovery is None:
                # the client caches discovery in a file: one of ours, removed on close (its
                # default is a shared file in /tmp that would outlive the run)
                self._discovery_dir = tempfile.mkdtemp(prefix="hvconform-discovery-")
                cache = f"{self._discovery_dir}/discovery.json"
                self._discovery = DynamicClient(self.client, cache_file=cache)  # type: ignore[no-untyped-call]
            found = self._discovery.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            raise ApiError(
                404, "NotFound", f"the cluster serves no {kind} in {api_version} (discovery)"
            ) from None
        except DynamicApiError as exc:
            raise ApiError(int(exc.status or 0), str(exc.reason), str(exc.body or "")) from None
        return ResourceInfo(
            api_version,
            kind,
            str(found.name),
            bool(found.namespaced),
            tuple(str(v) for v in (found.verbs or ())),
            "discovery",
        )

    def served(self) -> list[ResourceInfo]:
        """Every top-level resource the cluster serves (preferred versions), for a cleanup that
        must find the run's label on any kind."""
        from kubernetes.dynamic.resource import ResourceList

        self.resource("v1", "Namespace")  # the discovery client, made once
        seen: dict[tuple[str, str], ResourceInfo] = {}
        for found in self._discovery.resources.search():
            if isinstance(found, ResourceList) or "/" in str(found.name):
                continue  # the client's own *List kinds, and subresources (pods/log)
            if not getattr(found, "preferred", False):
                continue  # a kind's non-preferred versions: the preferred one lists it
            info = ResourceInfo(
                str(found.group_version),
                str(found.kind),
                str(found.name),
                bool(found.namespaced),
                tuple(str(v) for v in (found.verbs or ())),
                "discovery",
            )
            seen.setdefault((info.api_version, info.kind), info)
        return sorted(seen.values(), key=lambda i: (i.api_version, i.kind))

    # -- transport ------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> tuple[int, bytes]:
        """One HTTP request; raises ApiError on a non-2xx status."""
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": accept, "Content-Type": content_type}
        params = self.client.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.client.call_api(*params, _request_timeout=self.timeout)
            response.read()  # type: ignore[no-untyped-call]
        except ApiException as exc:  # transport-level failures come back this way too
            raise ApiError(int(exc.status or 0), str(exc.reason), str(exc.body or "")) from None
        data: bytes = response.data or b""
        if not 200 <= response.status <= 299:
            raise _api_error(response.status, str(response.reason), data)
        return response.status, data

    def text(self, path: str) -> str:
        """GET of a plain-text endpoint (a component's /metrics, also through a node proxy)."""
        _, data = self.request("GET", path, accept="text/plain")
        return data.decode(errors="replace")

    def _json(self, method: str, path: str, **kw: Any) -> Obj:
        _, data = self.request(method, path, **kw)
        parsed: Obj = json.loads(data) if data else {}
        return parsed

    # -- objects --------------------------------------------------------------------------

    def create(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        """POST the object (with this client's stamp labels); the server's reply, which names
        what was really made (its name, generated or not, and its UID)."""
        meta = obj.get("metadata", {})
        info = self.resource(obj["apiVersion"], obj["kind"])
        ns = str(meta.get("namespace", "")) if info.namespaced else ""
        if info.namespaced and not ns:
            raise UnsafePath(f"{describe(obj)} is namespaced (discovery) and names no namespace")
        query = [("dryRun", "All")] if dry_run else []
        body = obj
        if self.stamp:
            body = json.loads(json.dumps(obj))
            labels = body.setdefault("metadata", {}).setdefault("labels", {})
            labels.update(self.stamp)
        return self._json("POST", info.collection(ns), query=query, body=body)

    def replace(self, obj: Obj) -> Obj:
        current = self.get(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], _ns(obj))
        if current is None:
            raise ApiError(404, "NotFound", f"{describe(obj)} is gone")
        body = json.loads(json.dumps(obj))
        body["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion", "")
        if self.stamp:
            body["metadata"].setdefault("labels", {}).update(self.stamp)
        info = self.resource(obj["apiVersion"], obj["kind"])
        path = info.item(obj["metadata"]["name"], _ns(obj) if info.namespaced else "")
        return self._json("PUT", path, body=body)

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> Obj | None:
        info = self.resource(api_version, kind)
        try:
            return self._json("GET", info.item(name, namespace if info.namespaced else ""))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str = "",
        *,
        labels: str = "",
        fields: str = "",
    ) -> list[Obj]:
        """Objects of a kind (in `namespace`, or every namespace without one)."""
        info = self.resource(api_version, kind)
        query = [(k, v) for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v]
        path = info.collection(namespace if info.namespaced else "")
        items: list[Obj] = self._json("GET", path, query=query).get("items", [])
        return items

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str = "",
        *,
        grace: int | None = None,
        uid: str = "",
    ) -> bool:
        """Delete one object by name (foreground for owners), only while it still has `uid`
        when given (a precondition the server checks: an object re-made under the same name by
        someone else is never ours to delete); False when it was already gone."""
        info = self.resource(api_version, kind)
        path = info.item(name, namespace if info.namespaced else "")  # UnsafePath: no request
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        options["propagationPolicy"] = "Foreground"
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        if uid:
            options["preconditions"] = {"uid": uid}
        query = [("propagationPolicy", "Foreground")]
        if grace is not None:
            query.append(("gracePeriodSeconds", str(grace)))
        try:
            self.request("DELETE", path, query=query, body=options)
        except ApiError as exc:
            if exc.status == 404:
                return False
            if exc.status == 409 and uid:
                return False  # the precondition failed: that name is someone else's object now
            raise
        return True

    def wait_gone(
        self, api_version: str, kind: str, name: str, namespace: str, timeout: float, poll: float
    ) -> bool:
        deadline = time.monotonic() + timeout
        while self.get(api_version, kind, name, namespace) is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        return True

    # -- pods -----------------------------------------------------------------------------

    def pod_log(self, namespace: str, pod: str, container: str = "", tail: int = 0) -> str:
        query = [("container", container)] if container else []
        query += [("tailLines", str(tail))] if tail else []
        _, data = self.request(
            "GET", resource_path("v1", "Pod", namespace, pod) + "/log", query=query
        )
        return data.decode(errors="replace")

    def pod_proxy(self, namespace: str, pod: str, port: int, path: str) -> int:
        """HTTP status of GET on a pod port through the API server (no route to pods needed)."""
        target = resource_path("v1", "Pod", namespace, f"{pod}:{port}") + f"/proxy{path}"
        try:
            status, _ = self.request("GET", target)
        except ApiError as exc:
            return exc.status
        return status

    def exec(
        self, namespace: str, pod: str, argv: list[str], container: str = "", timeout: float = 60
    ) -> ExecResult:
        """Run argv in a container through the client's websocket stream; no stdin, no tty."""
        from kubernetes import client
        from kubernetes.stream import stream

        core = client.CoreV1Api(self.client)
        kwargs: dict[str, Any] = {"container": container} if container else {}
        ws = stream(
            core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            command=argv,
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
            binary=True,
            _preload_content=False,
            **kwargs,
        )
        out, err = b"", b""
        try:
            deadline = time.monotonic() + timeout
            while ws.is_open() and time.monotonic() < deadline:
                ws.update(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                out += ws.read_stdout(timeout=0) or b""
                err += ws.read_stderr(timeout=0) or b""
            if ws.is_open():
                raise TimeoutError(f"exec {argv[:3]} in {namespace}/{pod} exceeded {timeout:g}s")
            out += ws.read_stdout(timeout=0) or b""
            err += ws.read_stderr(timeout=0) or b""
            rc = ws.returncode
        finally:
            ws.close()
        return ExecResult(int(rc if rc is not None else -1), out, err)


def _ns(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("namespace", ""))


def _api_error(status: int, reason: str, data: bytes) -> ApiError:
    text = data.decode(errors="replace")
    try:
        status_obj = json.loads(text)
        message = str(status_obj.get("message", text))
        reason = str(status_obj.get("reason", reason) or reason)
    except ValueError:
        message = text.strip()[:500]
    return ApiError(status, reason, message, text)
