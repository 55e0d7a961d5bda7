"""Tests of coordl.remote (remote prep on Ray) against a real local Ray cluster."""
