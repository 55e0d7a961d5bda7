"""The cache partitioned across the nodes of a distributed job, on one Redis per node: set-up
(:mod:`.tier`), start-up agreement on addresses and secret (:mod:`.rendezvous`), the fetch tier
(:mod:`.fetch`), who owns which item (:mod:`.ownership`), the Redis client (:mod:`.redis_peer`), and TLS
for the nodes' Redis (:mod:`.peer_tls`)."""
