"""Test hosts for the tests and benchmarks (not part of the installed packages): emulated multi-node
networks in network namespaces (:mod:`tests.support.netns`) and a user-space NFS server
(:mod:`tests.support.ganesha`)."""
