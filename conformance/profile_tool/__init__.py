"""`hvconform profile init` and `hvconform profile check`: a maintainer's first profile in minutes.

`init` reads what a plugin's own DaemonSet already says (a manifest file, or a Helm chart rendered
by the suite's capped helm) and writes a commented profile, each value marked as read from the
objects or guessed; `check` loads a profile with the same loader a run uses and prints, target by
target, what the run would start and observe there and what that target refuses. Modules:
`daemonset` (the facts of one DaemonSet), `writer` (the commented YAML), `explain` (the
per-target lines), `cli` (the subcommand). Not `hvconform.profiles`: that folder ships data.
"""
