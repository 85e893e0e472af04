"""What the experiment does: scenarios, targets, collectors, runs, summaries and verdicts."""
