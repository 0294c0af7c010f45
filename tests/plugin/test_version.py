"""The source commit read from git's own files, checked against real git in a scratch repo:
a loose branch ref, packed refs, a detached HEAD and a linked worktree all give what
`git rev-parse HEAD` gives; no repository gives "unknown"."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from hv_device_plugin.api.names import DISTRIBUTION, installed_version
from hv_device_plugin.version import UNKNOWN, _git_head


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(repo)}  # fmt: skip
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def test_head_is_read_as_git_reads_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "one")
    assert _git_head(repo / ".git") == _git(repo, "rev-parse", "HEAD")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "two")
    _git(repo, "pack-refs", "--all")
    assert not (repo / ".git/refs/heads/main").exists()
    assert _git_head(repo / ".git") == _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "--detach", "HEAD~1")
    assert _git_head(repo / ".git") == _git(repo, "rev-parse", "HEAD")
    tree = tmp_path / "tree"
    _git(repo, "worktree", "add", "-q", "-b", "side", str(tree), "main")
    _git(tree, "commit", "-q", "--allow-empty", "-m", "three")
    assert (tree / ".git").is_file()
    assert _git_head(tree / ".git") == _git(tree, "rev-parse", "HEAD")
    assert _git_head(tmp_path / "nothing" / ".git") == UNKNOWN


def test_installed_version_is_what_importlib_metadata_reads() -> None:
    assert installed_version() == importlib.metadata.version(DISTRIBUTION) != "0.0.0"


def test_installed_version_without_an_installed_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "other_dist-1.2.3.dist-info").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(tmp_path / "missing"), "/etc/hostname"])
    assert installed_version() == "0.0.0"
    (tmp_path / "hv_device_plugin-9.8.7.dist-info").mkdir()
    assert installed_version() == "9.8.7"
