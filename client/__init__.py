"""client package (filled by the cluster issue)."""
