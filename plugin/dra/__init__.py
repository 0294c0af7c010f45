"""The DRA mode of the plugin: the same hypervisor through Dynamic Resource Allocation.

`service` serves the kubelet's plugin registration and DRAPlugin v1 APIs; `claims` keeps the
prepared claims on disk; `claim_specs` writes one CDI spec per claim with the device plugin's
own writer; `allocation` reads what the scheduler allocated from the ResourceClaim.
"""
