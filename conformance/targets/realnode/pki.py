"""Certificates and kubeconfigs for the real node, made with the `openssl` command line.

One CA signs: the API server's serving certificate (loopback and the first service IP), client
certificates for the admin (system:masters: the suite, the controller manager, the scheduler),
the kubelet (system:node:<name> in system:nodes, so the Node authorizer applies) and the API
server's kubelet client. The kubelet serves with a self-signed certificate of its own; etcd
listens on loopback without TLS. Keys are 0600 and stay below STATE.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from hvconform.targets.realnode import API_PORT, NODE_NAME, SERVICE_IP

DAYS = "30"


@dataclass(frozen=True)
class Client:
    name: str  # file stem
    cn: str
    org: str


CLIENTS = (
    Client("admin", "hv-admin", "system:masters"),
    Client("kubelet", f"system:node:{NODE_NAME}", "system:nodes"),
    Client("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()[-400:]}")


def _key(pki: Path, name: str) -> None:
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=pki)
    (pki / f"{name}.key").chmod(0o600)


def _sign(pki: Path, name: str, subject: str, ext: str) -> None:
    _key(pki, name)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    (pki / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", DAYS, "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
        cwd=pki,
    )  # fmt: skip
    (pki / f"{name}.csr").unlink()
    (pki / f"{name}.ext").unlink()


def make_pki(pki: Path) -> None:
    """CA, serving and client certificates, the service-account key pair. Idempotent."""
    if (pki / "done").exists():
        return
    pki.mkdir(parents=True, exist_ok=True, mode=0o700)
    _key(pki, "ca")
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=hv-node-ca", "-days", DAYS,
        "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.crt",
        cwd=pki,
    )  # fmt: skip
    _sign(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:{SERVICE_IP},DNS:localhost,"
        "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n",
    )
    for client in CLIENTS:
        _sign(
            pki,
            client.name,
            f"/O={client.org}/CN={client.cn}",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n",
        )
    _key(pki, "sa")
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    (pki / "done").write_text("ok\n")


def ensure_client(pki: Path, name: str, subject: str) -> None:
    """A client certificate of the node's CA, made once (a DRA driver's own identity)."""
    if not (pki / f"{name}.crt").exists():
        _sign(pki, name, subject,
              "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=clientAuth\n")  # fmt: skip


def kubeconfig(pki: Path, client: str, path: Path) -> Path:
    """A kubeconfig for one client certificate against the loopback API server."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- name: hv-node\n  cluster:\n"
        f"    server: https://127.0.0.1:{API_PORT}\n"
        f"    certificate-authority: {pki / 'ca.crt'}\n"
        f"users:\n- name: {client}\n  user:\n"
        f"    client-certificate: {pki / (client + '.crt')}\n"
        f"    client-key: {pki / (client + '.key')}\n"
        f"contexts:\n- name: hv-node\n  context:\n    cluster: hv-node\n    user: {client}\n"
        "current-context: hv-node\n"
    )
    path.chmod(0o600)
    return path
