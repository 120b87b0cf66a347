"""Reports: the experiment result, the sign-off checklist, summary.json and the HTML report."""
