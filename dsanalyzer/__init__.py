"""dsanalyzer."""
