"""nfs_cache."""
