"""gradcomp."""
