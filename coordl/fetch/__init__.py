"""Where raw item bytes come from: the fetch-tier protocol and the per-item path through the tiers with
read-ahead (:mod:`.pipeline`), the MinIO cache (:mod:`.minio`) and the sample cache (:mod:`.sample_cache`);
on that path each worker notes the item it is on, so that a worker's death names it (:mod:`.watch`).

Why this folder is large: it is a loader worker's whole per-item path (the tiers and their lookup, the
MinIO cache and the node's share of it, read-ahead and its pace, the page-cache policy, the sample cache,
skips, keys, the worker table), kept in one room so that what each item costs can be read, and held to
its budget against torch's loader (issue 59), in one place; each module is small and has one job."""
