"""The interconnect: NCCL_IB_HCA selector grammar, GID index choice, the port table and the bandwidth benchmark.

`selector` and `gid` are pure rules, `sysfs` is the only place that reads the system, `bench` needs torch only
when it runs, and `commands` wires them into `twinspark fabric ...`.
"""
