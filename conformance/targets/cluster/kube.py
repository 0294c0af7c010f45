"""The few Kubernetes API calls cluster targets make, over the official `kubernetes` client.

Objects are plain dicts, as rendered by conformance.manifests: requests go through the client's
ApiClient (kubeconfig, TLS, auth) with a generic resource path, so no generated model class ever
rewrites a manifest. Exec uses the client's websocket stream. This is the seam tests replace the
API server behind (a recorded-contract server on 127.0.0.1), never the code above it.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from conformance.contract.deploy import CLUSTER_SCOPED

Obj = dict[str, Any]

_PLURAL_EXCEPTIONS = {"Endpoints": "endpoints"}


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
    """/api/v1/... for the core group, /apis/GROUP/VERSION/... otherwise."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace and kind not in CLUSTER_SCOPED:
        base += f"/namespaces/{urllib.parse.quote(namespace, safe='')}"
    base += f"/{plural(kind)}"
    return base + (f"/{urllib.parse.quote(name, safe='')}" if name else "")


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

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]

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
        meta = obj.get("metadata", {})
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace", ""))
        query = [("dryRun", "All")] if dry_run else []
        return self._json("POST", path, query=query, body=obj)

    def replace(self, obj: Obj) -> Obj:
        current = self.get(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], _ns(obj))
        if current is None:
            raise ApiError(404, "NotFound", f"{describe(obj)} is gone")
        body = json.loads(json.dumps(obj))
        body["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion", "")
        return self._json("PUT", object_path(obj), body=body)

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> Obj | None:
        try:
            return self._json("GET", resource_path(api_version, kind, namespace, name))
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
        query = [(k, v) for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v]
        items: list[Obj] = self._json(
            "GET", resource_path(api_version, kind, namespace), query=query
        ).get("items", [])
        return items

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str = "",
        *,
        grace: int | None = None,
    ) -> bool:
        """Delete (foreground for owners); False when it was already gone."""
        query = [("propagationPolicy", "Foreground")]
        if grace is not None:
            query.append(("gracePeriodSeconds", str(grace)))
        try:
            self.request("DELETE", resource_path(api_version, kind, namespace, name), query=query)
        except ApiError as exc:
            if exc.status == 404:
                return False
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
