"""The suite on every node of a pool through Sonobuoy: the plugin definition (`plugin`), the
run in each node's pod (`node`) and the results in Sonobuoy's manual format (`results`).

Above the CLI: the node's pod makes one `hvconform run`, so its inputs are validated as on a
laptop; nothing here is imported by a target or a scenario.
"""
