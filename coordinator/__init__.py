"""coordinator package (filled by the cluster issue)."""
