"""Example user workloads (see conf/workload/user_*.yaml and the README)."""
