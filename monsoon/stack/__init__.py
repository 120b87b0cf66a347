"""Stacks: start, supervise and stop a deployment under test; ports, readiness, labels and the reaper, provisioning."""
