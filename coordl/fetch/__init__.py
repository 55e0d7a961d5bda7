"""Where raw item bytes come from: the fetch-tier protocol and the per-item path through the tiers with
read-ahead (:mod:`.pipeline`), the MinIO cache (:mod:`.minio`) and the sample cache (:mod:`.sample_cache`);
on that path each worker notes the item it is on, so that a worker's death names it (:mod:`.watch`)."""
