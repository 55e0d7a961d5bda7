"""Datasets read from packed files instead of a tree of small files: tar shards (:mod:`.tar`,
``coordl.TarShards``, over the shard names and indexes of :mod:`.shards`), an LMDB environment
(:mod:`.lmdb`, ``coordl.LMDBDataset``, one environment per process in :mod:`.lmdbenv`) and the shuffle
that stays within a few shards (:mod:`.shard_sampler`, ``coordl.ShardSampler``). :mod:`coordl.packing`
writes them."""
