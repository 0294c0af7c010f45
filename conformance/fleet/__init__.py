"""`hvconform fleet-report`: the suite's per-node results of a node pool merged into one report.

Each node runs the catalogue on its own (`hvconform run --target cluster --nodes ...` writes
OUT/<node>/results.json; a Sonobuoy plugin leaves one per node in its tarball); this package
reads them all (sources.py: directories and tarballs, read strictly and in memory), lays the
verdicts out per check per node (model.py), summarises each figure across the nodes (stats.py: min,
median, p95, max and the outliers named), names the environment facts that differ between
nodes, and gives the pool one verdict (render.py writes fleet.json, fleet.txt and fleet.html;
cli.py is the subcommand). It reads results only, as hvconform.report does.
"""
