"""Observation: collectors sampled into the timeline, storage read-back, parsers, live progress."""
