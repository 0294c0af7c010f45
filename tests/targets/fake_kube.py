"""Recording stand-in for the Kubernetes API (a recorded contract, never a live result).

An HTTP server on 127.0.0.1 that speaks the few REST calls the cluster targets make (plus the
exec websocket, whose node commands answer as tests/targets/fakes.py records them) and keeps just
enough state (objects created, deleted, replaced) for a run to go end to end. A failure can be
injected once into any request, by regular expression.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.targets.fakes import node_answer

# What the stand-in serves through discovery (group/version, kind, plural, namespaced): the kinds
# a cluster run touches and the ones the blast-radius tests name; a real API server's answers
# have the same shape (APIGroupList, APIResourceList).
SERVED = (
    ("v1", "Namespace", "namespaces", False),
    ("v1", "Node", "nodes", False),
    ("v1", "Pod", "pods", True),
    ("v1", "Service", "services", True),
    ("v1", "ServiceAccount", "serviceaccounts", True),
    ("v1", "ConfigMap", "configmaps", True),
    ("v1", "Secret", "secrets", True),
    ("v1", "PersistentVolume", "persistentvolumes", False),
    ("apps/v1", "DaemonSet", "daemonsets", True),
    ("apps/v1", "ReplicaSet", "replicasets", True),
    ("apps/v1", "Deployment", "deployments", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role", "roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True),
    ("resource.k8s.io/v1", "DeviceClass", "deviceclasses", False),
    ("resource.k8s.io/v1", "ResourceSlice", "resourceslices", False),
    ("resource.k8s.io/v1", "ResourceClaim", "resourceclaims", True),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        False,
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        False,
    ),
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        False,
    ),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False),
    ("apiregistration.k8s.io/v1", "APIService", "apiservices", False),
    ("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors", True),
    ("example.com/v1", "Widget", "widgets", False),  # a CRD's kind the table does not know
)
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def discovery(path: str) -> dict[str, Any] | None:
    """The discovery document at `path`, or None when `path` is not one."""
    if path == "/version":
        return {"major": "1", "minor": "37", "gitVersion": "v1.37.2-contract"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"]}
    groups = sorted({gv for gv, *_ in SERVED if "/" in gv})
    if path == "/apis":
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": gv.split("/")[0],
                    "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                    "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]},
                }
                for gv in groups
            ],
        }
    for gv in ("v1", *groups):
        if path == ("/api/v1" if gv == "v1" else f"/apis/{gv}"):
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": gv,
                "resources": [
                    {
                        "name": plural,
                        "singularName": "",
                        "namespaced": scoped,
                        "kind": kind,
                        "verbs": VERBS,
                    }
                    for g, kind, plural, scoped in SERVED
                    if g == gv
                ],
            }
    return None


class KubeState:
    """Objects by path; pods synthesized for DaemonSets and workload pods admitted as recorded."""

    def __init__(self, recorded: dict[str, Any]) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.serial = 0
        self.recorded = recorded
        for node in recorded["nodes"]:
            self.objects[f"/api/v1/nodes/{node['metadata']['name']}"] = copy.deepcopy(node)
        for pod in recorded.get("pods", []):
            meta = pod["metadata"]
            self.objects[f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"] = (
                copy.deepcopy(pod)
            )

    def uid(self) -> str:
        self.serial += 1
        return f"00000000-0000-4000-8000-{self.serial:012d}"

    def stamp(self, obj: dict[str, Any]) -> None:
        meta = obj.setdefault("metadata", {})
        meta["uid"] = self.uid()
        meta["resourceVersion"] = str(self.serial)
        meta["creationTimestamp"] = f"2026-01-01T00:{self.serial // 60:02d}:{self.serial % 60:02d}Z"
        meta.setdefault("generation", 1)

    def node_for(self, labels: dict[str, str]) -> str:
        for path, obj in self.objects.items():
            if path.startswith("/api/v1/nodes/"):
                node_labels = obj["metadata"].get("labels", {})
                if all(node_labels.get(k) == v for k, v in labels.items()):
                    return str(obj["metadata"]["name"])
        return ""

    def running_status(self, containers: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                    "containerID": f"containerd://{hashlib.sha256(str(self.serial).encode()).hexdigest()}",
                    **image_status(str(c.get("image", ""))),
                }
                for c in containers
            ],
        }

    def spawn_daemon_pods(self, ds_path: str, ds: dict[str, Any]) -> None:
        ns, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
        for path in [p for p, o in self.objects.items() if o.get("_owner") == ds_path]:
            del self.objects[path]
        spec = ds["spec"]["template"]["spec"]
        node = self.node_for(spec.get("nodeSelector", {}))
        if not node:
            return
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{self.serial:05d}",
                "namespace": ns,
                "labels": dict(ds["spec"]["template"]["metadata"].get("labels", {})),
            },
            "spec": {**copy.deepcopy(spec), "nodeName": node},
            "_owner": ds_path,
        }
        self.stamp(pod)
        pod["status"] = self.running_status(spec["containers"])
        self.objects[f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}"] = pod
        ds["status"] = {
            "desiredNumberScheduled": 1,
            "updatedNumberScheduled": 1,
            "numberAvailable": 1,
            "numberReady": 1,
            "observedGeneration": ds["metadata"]["generation"],
        }

    def admit(self, pod: dict[str, Any]) -> None:
        """Workload pods: admitted and running, unless the recorded contract says otherwise."""
        refused = self.recorded.get("refuse_workloads")
        if refused and pod["metadata"].get("labels", {}).get("hvconform/role") == "guest":
            pod["status"] = copy.deepcopy(refused)
        else:
            pod["status"] = self.running_status(pod["spec"]["containers"])


def image_status(ref: str) -> dict[str, str]:
    """What containerd's CRI reports for an image: the normalized name and a repo digest (the
    one the reference pins, else a stand-in digest of the reference)."""
    name, _, digest = ref.partition("@")
    repo = name if "/" in name.split(":")[0] else f"docker.io/library/{name}"
    repo_only = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
    digest = digest or f"sha256:{hashlib.sha256(ref.encode()).hexdigest()}"
    return {"image": repo, "imageID": f"{repo_only}@{digest}"}


def clean(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


class FakeKube:
    """The recorded-contract API server on 127.0.0.1; `requests` is the log of what was asked."""

    def __init__(self, recorded: dict[str, Any], rules: dict[str, Any]) -> None:
        self.state = KubeState(recorded)
        self.rules = rules
        self.requests: list[str] = []
        self.execs: list[list[str]] = []
        self.fail = ""
        self.fail_status = 500
        self.failed = False
        self.lock = threading.Lock()
        self.node_state: dict[str, int] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.handle(self, "GET")

            def do_POST(self) -> None:
                fake.handle(self, "POST")

            def do_PUT(self) -> None:
                fake.handle(self, "PUT")

            def do_DELETE(self) -> None:
                fake.handle(self, "DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeKube:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "contract", "cluster": {"server": self.url}}],
            "users": [{"name": "contract", "user": {"token": "recorded-contract"}}],
            "contexts": [
                {"name": "contract", "context": {"cluster": "contract", "user": "contract"}}
            ],
            "current-context": "contract",
        }
        path.write_text(json.dumps(config))
        return path

    # -- HTTP -----------------------------------------------------------------------------

    def send(
        self, h: BaseHTTPRequestHandler, status: int, body: Any, ctype: str = "application/json"
    ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def status(self, h: BaseHTTPRequestHandler, code: int, reason: str, message: str) -> None:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": reason,
            "message": message,
            "code": code,
        }
        self.send(h, code, body)

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = urllib.parse.parse_qs(url.query)
        line = f"{method} {url.path}{'?' + url.query if url.query else ''}"
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length)) if length else None
        with self.lock:
            self.requests.append(line)
            if self.fail and not self.failed and re.search(self.fail, line):
                self.failed = True
                self.status(
                    h,
                    self.fail_status,
                    "InternalError",
                    "injected failure (recorded-contract test)",
                )
                return
            deny = self.state.recorded.get("deny_dry_run")
            if (
                deny
                and "dryRun=All" in line
                and body
                and re.search(deny["match"], json.dumps(body))
            ):
                self.status(h, deny["code"], deny["reason"], deny["message"])
                return
            if url.path.endswith("/exec") and h.headers.get("Upgrade", "").lower() == "websocket":
                self.exec_ws(h, query.get("command", []))
                return
            self.route(h, method, url.path, query, body)

    def route(
        self,
        h: BaseHTTPRequestHandler,
        method: str,
        path: str,
        query: dict[str, list[str]],
        body: Any,
    ) -> None:
        objects = self.state.objects
        # a recorded object at the path (a test's own /version) wins over the discovery answer
        served = discovery(path) if method == "GET" and path not in objects else None
        if served is not None:
            self.send(h, 200, served)
            return
        if "/proxy/" in path:
            self.send(h, 200, b"ok\n", "text/plain")
            return
        if path.endswith("/log"):
            pod = objects.get(path[: -len("/log")])
            if pod is None:
                self.status(h, 404, "NotFound", "pod not found")
                return
            role = pod["metadata"].get("labels", {}).get("hvconform/role", "plugin")
            self.send(h, 200, self.state.recorded["logs"].get(role, "").encode(), "text/plain")
            return
        if method == "POST":
            obj = copy.deepcopy(body)
            if not obj["metadata"].get("name") and obj["metadata"].get("generateName"):
                suffix = hashlib.sha256(str(self.state.serial).encode()).hexdigest()[:5]
                obj["metadata"]["name"] = obj["metadata"]["generateName"] + suffix
            full = f"{path}/{obj['metadata']['name']}"
            if "All" in query.get("dryRun", []):
                self.send(h, 201, obj)
                return
            if full in objects:
                self.status(h, 409, "AlreadyExists", f"{obj['metadata']['name']} already exists")
                return
            self.state.stamp(obj)
            objects[full] = obj
            if obj["kind"] == "DaemonSet":
                self.state.spawn_daemon_pods(full, obj)
            elif obj["kind"] == "Pod" and obj["spec"].get("nodeName"):
                self.state.admit(obj)
            self.send(h, 201, clean(obj))
        elif method == "PUT":
            if path not in objects:
                self.status(h, 404, "NotFound", "not found")
                return
            obj = copy.deepcopy(body)
            obj["metadata"]["uid"] = objects[path]["metadata"]["uid"]
            obj["metadata"]["generation"] = int(objects[path]["metadata"].get("generation", 1)) + 1
            objects[path] = obj
            if obj["kind"] == "DaemonSet":
                self.state.spawn_daemon_pods(path, obj)
            self.send(h, 200, clean(obj))
        elif method == "DELETE":
            if path not in objects:
                self.status(h, 404, "NotFound", "not found")
                return
            want = ((body or {}).get("preconditions") or {}).get("uid")
            if want and objects[path]["metadata"].get("uid") != want:
                self.status(h, 409, "Conflict", f"Precondition failed: UID in precondition: {want}")
                return
            obj = objects.pop(path)
            for other in [p for p, o in objects.items() if o.get("_owner") == path]:
                del objects[other]
            owner = obj.get("_owner")
            if owner in objects:  # the DaemonSet controller replaces a deleted pod
                self.state.spawn_daemon_pods(owner, objects[owner])
            if obj["kind"] == "Namespace":
                prefix = f"/namespaces/{obj['metadata']['name']}/"
                for other in [p for p in objects if prefix in p]:
                    del objects[other]
            self.send(h, 200, {"kind": "Status", "status": "Success"})
        elif path in objects:
            self.send(h, 200, clean(objects[path]))
        elif self.is_collection(path):
            self.send(h, 200, {"kind": "List", "items": self.select(path, query)})
        else:
            self.status(h, 404, "NotFound", f"{path} not found")

    def is_collection(self, path: str) -> bool:
        return path.rstrip("/").rsplit("/", 1)[-1] in {plural for _, _, plural, _ in SERVED}

    def select(self, path: str, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        kind = path.rsplit("/", 1)[-1]
        labels = dict(
            kv.split("=", 1) for kv in ",".join(query.get("labelSelector", [])).split(",") if kv
        )
        fields = dict(
            kv.split("=", 1) for kv in ",".join(query.get("fieldSelector", [])).split(",") if kv
        )
        ns_prefix = path[: -len(kind)]
        found = []
        for p, obj in sorted(self.state.objects.items()):
            if (
                not p.startswith(ns_prefix if "/namespaces/" in path else "/")
                or p.rsplit("/", 2)[-2] != kind
            ):
                continue
            if any(obj["metadata"].get("labels", {}).get(k) != v for k, v in labels.items()):
                continue
            if (
                "spec.nodeName" in fields
                and obj.get("spec", {}).get("nodeName") != fields["spec.nodeName"]
            ):
                continue
            found.append(clean(obj))
        return found

    # -- exec over a websocket (v4.channel.k8s.io) ---------------------------------------

    def exec_ws(self, h: BaseHTTPRequestHandler, argv: list[str]) -> None:
        key = h.headers["Sec-WebSocket-Key"]
        # RFC 6455 fixes SHA-1 for the handshake; nothing here is a security use.
        digest = hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode(), usedforsecurity=False
        ).digest()
        accept = base64.b64encode(digest)
        h.send_response(101, "Switching Protocols")
        h.send_header("Upgrade", "websocket")
        h.send_header("Connection", "Upgrade")
        h.send_header("Sec-WebSocket-Accept", accept.decode())
        h.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
        h.end_headers()
        self.execs.append(argv)
        pod = urllib.parse.urlsplit(h.path).path.split("/")[-2]
        with open(os.environ["HV_FAKE_LOG"], "a") as f:  # one timeline with the executables
            f.write(json.dumps(["exec", pod, *argv]) + "\n")
        rc, out, err = node_answer(self.rules, argv, self.node_state)
        status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        if rc:
            status = {
                "metadata": {},
                "status": "Failure",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(rc)}]},
            }
        for channel, data in ((1, out), (2, err), (3, json.dumps(status).encode())):
            if data:
                h.wfile.write(_frame(bytes([channel]) + data))
        h.wfile.write(_frame(b"\x03\xe8", opcode=0x8))
        h.wfile.flush()
        h.close_connection = True
        with contextlib.suppress(OSError):
            h.connection.shutdown(socket.SHUT_WR)


def _frame(payload: bytes, opcode: int = 0x2) -> bytes:
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 65536:
        head += bytes([126]) + n.to_bytes(2, "big")
    else:
        head += bytes([127]) + n.to_bytes(8, "big")
    return head + payload


def iter_lines(text: str) -> Iterator[str]:
    yield from (line for line in text.splitlines() if line.strip())
