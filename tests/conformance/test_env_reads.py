"""No environment variable a user sets for a run is read after the CLI (issue 37): each is a
typed field (the run context, `hvconform.contract.settings.RunSettings`, the parser's flag
defaults), read once by the CLI. An AST scan of every module lists each read of a named
variable (`os.environ.get(NAME)`, `os.environ[NAME]`, `os.getenv(NAME)`); outside the CLIs and
the settings module each must be one of the reads below, with why it is not a run's setting.
Copying the whole environment for a child process is not a read."""

from __future__ import annotations

import ast
from pathlib import Path

from hvconform.contract import settings

ROOT = Path(__file__).resolve().parents[2] / "conformance"
# The CLIs read their flags' environment defaults, the settings module its own fields.
# sonobuoy/node.py is the CLI of the Sonobuoy plugin's container: its flags' defaults are what
# Sonobuoy and the downward API set there (NODE_NAME, SONOBUOY_RESULTS_DIR, the API's address).
READERS = {"cli.py", "cli_parser.py", "cli_inputs.py", "manifests/cli.py", "contract/settings.py",
           "sonobuoy/node.py"}  # fmt: skip
# path -> the variables read there, and why each is not something a user sets for a run.
ALLOWED: dict[str, dict[str, str]] = {
    "contract/runcontext.py": {"ENV_CONTEXT": "the run hands its context's path to its workers"},
    "targets/host/netns.py": {
        "PYTEST_XDIST_WORKER": "pytest-xdist's worker id, for this worker's names",
        "OWNER_ENV": "the run owner's id, which the suite sets for its own children",
    },
    "report/render.py": {"GITHUB_STEP_SUMMARY": "GitHub Actions' summary file, set by the runner"},
    "contract/buildinfo.py": {"ENV": "the suite image's build facts, set by its Dockerfile"},
    "guest/__main__.py": {"HYPERLIGHT_DEVICE_PATH": "read inside the workload, from its pod spec"},
    "manifests/chart.py": {"XDG_CACHE_HOME": "the freedesktop cache dir, where helm is cached"},
    "targets/kindnode/workflow.py": {"PATH": "extended for a child process"},
    "targets/realnode/runtimes.py": {"PATH": "extended for containerd (its runtime's shim)"},
    # where this machine keeps caches, roots and its package mirror: the machine's layout
    "targets/cluster/kindbin.py": {
        "HV_KIND_CACHE": "the machine's kind cache",
        "PATH": "extended for a child process",
    },
    "targets/container/images.py": {
        "HV_IMAGE_CACHE": "the machine's image cache",
        "HV_DEBIAN_MIRROR": "the machine's Debian mirror for offline image bases",
    },
    "targets/container/engine.py": {
        "HV_DOCKER_DATA_ROOT": "the private engine's data root on this machine",
        "HV_DOCKER_EXEC_ROOT": "the private engine's exec root on this machine",
    },
}


def reads(tree: ast.AST) -> list[str]:
    """Every environment variable read by name in `tree` (the name, or the constant's)."""
    found = []
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            if func == "os.getenv" or (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and _environ_like(node.func.value)
            ):
                key = node.args[0]
        elif (
            isinstance(node, ast.Subscript)
            and _environ_like(node.value)
            and isinstance(node.ctx, ast.Load)
        ):
            key = node.slice
        if key is not None:
            found.append(key.value if isinstance(key, ast.Constant) else ast.unparse(key))
    return found


def _environ_like(node: ast.expr) -> bool:
    text = ast.unparse(node)
    # os.environ, or a function's `environ` parameter defaulting to it (x if environ is None ...)
    return text == "os.environ" or (isinstance(node, ast.IfExp) and "os.environ" in text)


def findings() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in READERS:
            continue
        names = reads(ast.parse(path.read_text(), str(path)))
        if names:
            found[rel] = names
    return found


def test_no_run_setting_is_read_after_the_cli() -> None:
    found = findings()
    unexpected = {
        path: [n for n in names if n not in ALLOWED.get(path, {})] for path, names in found.items()
    }
    unexpected = {p: n for p, n in unexpected.items() if n}
    assert not unexpected, (
        f"environment reads after the CLI: {unexpected}; make each a typed field "
        "(hvconform.contract.settings, or a flag with its environment default)"
    )
    stale = {p: sorted(set(v) - set(found.get(p, []))) for p, v in ALLOWED.items()}
    assert not {p: v for p, v in stale.items() if v}, f"allowed but no longer read: {stale}"


def test_the_scan_finds_each_form_of_read() -> None:
    tree = ast.parse(
        'import os\nos.environ.get("HV_A", "")\nos.environ["HV_B"]\nos.getenv("HV_C")\n'
        'os.environ["HV_D"] = "set"\ndict(os.environ, X="1")\n'
    )
    assert reads(tree) == ["HV_A", "HV_B", "HV_C"]


def test_every_run_setting_has_its_variable_and_travels_in_the_context() -> None:
    from hvconform.contract.runcontext import RunContext

    env = {var: f"/x/{name}" for name, (var, _) in settings.ENV.items()}
    read = settings.RunSettings.from_env(env)
    assert all(getattr(read, name) == f"/x/{name}" for name in settings.ENV)
    assert set(settings.ENV) == set(read.to_json())
    data = RunContext.from_json({**_minimal_context(), "settings": read.to_json()})
    assert data.settings == read


def _minimal_context() -> dict[str, object]:
    from hvconform.contract.plugin import resolve
    from hvconform.contract.runcontext import SCHEMA

    plugin = resolve().to_json()
    return {"schema": SCHEMA, "run_id": "r", "out_dir": "/tmp/r", "target": "local",
            "plugin": plugin, "recovery_timeout_s": 60.0, "markexpr": "", "workers": "0",
            "options": {"family": "local", "runtime": "process"}}  # fmt: skip
