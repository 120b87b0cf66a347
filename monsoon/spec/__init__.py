"""Specs: validated, frozen descriptions parsed from YAML (stacks, experiments, faults, shapes, payloads)."""
