"""Cron-scheduled sweeps: the shipped schedule files (`*.yaml`, package data) and the daemon that submits each
firing as a Ray Job, never doubled, never silently lost. The command line is `orchestrator/schedule.py`
(`specsweep-schedule`)."""
