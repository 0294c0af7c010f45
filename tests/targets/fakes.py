"""Recording stand-ins for `kind`, `docker` and `az` (recorded contracts); the Kubernetes API
stand-in is in tests/targets/fake_kube.py.

Nothing here is a live result. The fake executables append their argv to a log and answer with
the outputs recorded in fixtures/contracts/. A failure can be injected once into any command, by
regular expression.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.scripts import python_script

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "fixtures" / "contracts"

FAKE_EXE = r'''"""Recorded-contract stand-in for __NAME__: logs argv, answers from the recorded rules."""
import json, os, re, shutil, signal, sys, time
from pathlib import Path

name = "__NAME__"
argv = sys.argv[1:]
with open(os.environ["HV_FAKE_LOG"], "a") as f:
    f.write(json.dumps([name, *argv]) + "\n")
rules = json.loads(Path(os.environ["HV_FAKE_RULES"]).read_text())
table = name
if name == "docker" and argv[:1] == ["exec"]:
    table, argv = "node", argv[2:]
line = " ".join([name if table != "node" else "node", *argv])
state = Path(os.environ["HV_FAKE_STATE"])
fail = os.environ.get("HV_FAKE_FAIL", "")
if fail and re.search(fail, line) and not (state / "failed").exists():
    (state / "failed").write_text(line)
    sys.stderr.write("injected failure (recorded-contract test)\n")
    sys.exit(1)
term = os.environ.get("HV_FAKE_SIGTERM", "")
if term and re.search(term, line):
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(0.2)
for i, rule in enumerate(rules.get(table, [])):
    if not re.search(rule["match"], " ".join(argv)):
        continue
    outputs = rule.get("outputs") or [rule]
    counter = state / f"{table}-{i}"
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    out = outputs[min(n, len(outputs) - 1)]
    if rule.get("kubeconfig_arg"):
        dest = argv[argv.index(rule["kubeconfig_arg"]) + 1]
        shutil.copyfile(os.environ["HV_FAKE_KUBECONFIG"], dest)
    sys.stdout.write(out.get("stdout", ""))
    sys.stderr.write(out.get("stderr", ""))
    sys.exit(out.get("rc", 0))
sys.stderr.write(f"no recorded output for: {line}\n")
sys.exit(97)
'''


def load_rules(
    target: str, overrides: dict[str, list[dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """The recorded outputs for one target: its executables plus the node's commands."""
    rules: dict[str, Any] = json.loads((CONTRACTS / f"{target}.json").read_text())
    node: dict[str, Any] = json.loads((CONTRACTS / "node.json").read_text())
    rules["node"] = [*(overrides or {}).get("node", []), *node["node"]]
    for key, extra in (overrides or {}).items():
        if key != "node":
            rules[key] = [*extra, *rules.get(key, [])]
    return rules


def install_fakes(bin_dir: Path, names: tuple[str, ...]) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        exe = bin_dir / name
        python_script(exe, FAKE_EXE.replace("__NAME__", name))


def read_log(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def node_answer(
    rules: dict[str, Any], argv: list[str], state: dict[str, int]
) -> tuple[int, bytes, bytes]:
    """What a node command answers under the recorded rules (used by the exec websocket)."""
    line = " ".join(argv)
    for i, rule in enumerate(rules["node"]):
        if re.search(rule["match"], line):
            outputs = rule.get("outputs") or [rule]
            n = state.get(f"node-{i}", 0)
            state[f"node-{i}"] = n + 1
            out = outputs[min(n, len(outputs) - 1)]
            return (
                int(out.get("rc", 0)),
                out.get("stdout", "").encode(),
                out.get("stderr", "").encode(),
            )
    return 97, b"", f"no recorded output for: {line}\n".encode()
