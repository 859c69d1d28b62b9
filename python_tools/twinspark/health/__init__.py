"""Health of a TwinSpark pair: checks.py judges, gather.py and remote.py collect, report.py prints.

`twinspark health` (command.py) is the one entry point used by the terminal, playbooks/health.yml and the
twinspark-health.timer on the head.
"""
