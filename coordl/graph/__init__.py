"""coordl.graph (GLoader): pipelined loading for sampling-based GNN training.

    import coordl.graph as cg
    graph = cg.Graph.load("/data/products")      # CSR + features, memory-mapped
    loader = cg.NeighborLoader(graph, seeds=graph.train_idx, fanouts=[15, 10], batch_size=1024,
                               shuffle=True, num_workers=2, feature_cache_bytes=4 << 30, pipeline_depth=4)
    for batch in loader:
        ...

Names load lazily: ``import coordl.graph`` does not import torch.
"""

from __future__ import annotations

from shmem.lazy import lazy_exports

_LAZY = {
    "Graph": "coordl.graph.graph",
    "GraphFormatError": "coordl.graph.graph",
    "NeighborLoader": "coordl.graph.loader",
    "Batch": "coordl.graph.batch",
    "FeatureCache": "coordl.graph.cache",
    "GraphSAGE": "coordl.graph.models",
    "synth_graph": "coordl.graph.synth",
    "sample_blocks": "coordl.graph.sampler",
}

__getattr__, __dir__, __all__ = lazy_exports("coordl.graph", globals(), _LAZY)
