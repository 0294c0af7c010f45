"""The host toolkit: what a target needs to run a plugin and its workloads on this machine.

The sandbox (zero capabilities, no_new_privs, own mount and network namespaces) and its
launcher, network namespaces with a run owner, bind mounts, host files and device nodes made by
mknod, process bookkeeping. The local, container and real-node targets use it alike, and the
cluster family its host-file reads; it imports no target family (import-linter holds that), so
it is a toolkit, not a target.
"""
