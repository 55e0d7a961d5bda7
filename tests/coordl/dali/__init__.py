"""Tests of coordl.dali (skipped where NVIDIA DALI is not installed; GPU tests marked gpu)."""
