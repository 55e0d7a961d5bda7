"""Tests of the leaf package shmem."""
