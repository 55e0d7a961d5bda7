"""The cache partitioned across the nodes of a distributed job: set-up (:mod:`.tier`), the fetch tier
(:mod:`.fetch`), who owns which item (:mod:`.ownership`), and the peer transport: messages
(:mod:`.protocol`), handshake and secret (:mod:`.auth`), server (:mod:`.server`), client (:mod:`.peer`),
and the Redis option (:mod:`.redis_peer`)."""
