"""Real KVM guest workload, CDI resolver and privilege drop; standard library only.

Run `python -m hvconform.guest --help`. Modules: kvm_guest (run_guest, run_counter),
cdi_resolve (CDIRegistry, resolve), privileges (drop_privileges).
"""
