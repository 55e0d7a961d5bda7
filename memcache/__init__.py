"""memcache."""
