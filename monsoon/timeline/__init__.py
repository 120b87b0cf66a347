"""The run directory's data: the timeline, latency histograms, accounting, views (fault windows)."""
