"""Graph construction, save/load round trip, PyG input, and named errors for bad files."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from coordl.graph.graph import Graph, GraphFormatError
from tests.coordl.graph.conftest import edge_set


def test_from_edges_csr_lists_sources_of_in_edges(tiny):
    assert sorted(tiny.indices[tiny.indptr[0] : tiny.indptr[1]].tolist()) == [1, 2, 3, 4, 5]
    assert tiny.in_degree().tolist() == [5, 1, 1, 1, 0, 0, 0]
    assert tiny.out_degree.tolist() == [2, 1, 2, 1, 1, 1, 0]


def test_from_edges_rejects_bad_input():
    with pytest.raises(ValueError, match="outside"):
        Graph.from_edges([0, 9], [1, 1], np.zeros((3, 2)), None)
    with pytest.raises(ValueError, match="labels has 2 rows"):
        Graph.from_edges([0], [1], np.zeros((3, 2)), np.zeros(2))
    with pytest.raises(ValueError, match="differ in length"):
        Graph.from_edges([0, 1], [1], np.zeros((3, 2)), None)


def test_save_load_round_trip(tiny, tmp_path):
    tiny.save(tmp_path / "g")
    g = Graph.load(tmp_path / "g")
    assert isinstance(g.features, np.memmap)
    assert g.num_nodes == 7 and g.num_edges == 8
    np.testing.assert_array_equal(g.indptr, tiny.indptr)
    np.testing.assert_array_equal(g.indices, tiny.indices)
    np.testing.assert_array_equal(g.features, tiny.features)
    np.testing.assert_array_equal(g.labels, tiny.labels)
    assert edge_set(g) == edge_set(tiny)


def test_pickled_file_graph_carries_only_its_path(rmat):
    blob = pickle.dumps(rmat)
    assert len(blob) < 1000  # the arrays (3000 x 8 features, 40k edges) never travel
    again = pickle.loads(blob)
    np.testing.assert_array_equal(again.features[:5], rmat.features[:5])


def test_resave_into_own_directory_keeps_the_data(rmat_dir, tmp_path):
    import shutil

    shutil.copytree(rmat_dir, tmp_path / "g")
    g = Graph.load(tmp_path / "g")
    before = np.array(g.features[:10])
    g.save(tmp_path / "g")
    np.testing.assert_array_equal(Graph.load(tmp_path / "g").features[:10], before)


def test_load_pyg_style_dict(tmp_path):
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
    torch.save(
        {"edge_index": edge_index, "x": x, "y": y, "train_mask": torch.tensor([True, False, True])},
        tmp_path / "d.pt",
    )
    g = Graph.load(tmp_path / "d.pt")
    assert edge_set(g) == {(0, 1), (1, 2), (2, 0)}
    np.testing.assert_allclose(g.features, x.numpy())
    assert g.train_idx.tolist() == [0, 2]


def test_from_pyg_duck_typed_object():
    class Data:  # what a PyG Data exposes
        edge_index = torch.tensor([[3, 0], [0, 1]])
        x = torch.ones(4, 2)
        y = torch.arange(4)

    g = Graph.from_pyg(Data())
    assert edge_set(g) == {(3, 0), (0, 1)} and g.num_nodes == 4


def test_load_real_pyg_data(tmp_path):
    pyg = pytest.importorskip("torch_geometric.data")
    data = pyg.Data(x=torch.randn(5, 3), edge_index=torch.tensor([[0, 1], [2, 3]]), y=torch.arange(5))
    torch.save(data, tmp_path / "data.pt")
    g = Graph.load(tmp_path / "data.pt")
    assert edge_set(g) == {(0, 2), (1, 3)} and g.labels.tolist() == [0, 1, 2, 3, 4]


def test_missing_graph_names_the_path(tmp_path):
    with pytest.raises(GraphFormatError, match="no such graph"):
        Graph.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GraphFormatError, match="graph.json"):
        Graph.load(tmp_path / "empty")


def test_truncated_features_name_the_file(tiny, tmp_path):
    tiny.save(tmp_path / "g")
    f = tmp_path / "g" / "features.bin"
    f.write_bytes(f.read_bytes()[:-4])
    with pytest.raises(GraphFormatError, match=r"features\.bin: truncated: expected 84 bytes"):
        Graph.load(tmp_path / "g")


def test_missing_array_file_named(tiny, tmp_path):
    tiny.save(tmp_path / "g")
    (tmp_path / "g" / "indices.bin").unlink()
    with pytest.raises(GraphFormatError, match=r"indices\.bin: missing"):
        Graph.load(tmp_path / "g")


def test_bad_header_named(tiny, tmp_path):
    tiny.save(tmp_path / "g")
    header = tmp_path / "g" / "graph.json"
    header.write_text("{not json")
    with pytest.raises(GraphFormatError, match=r"graph\.json: header is not valid JSON"):
        Graph.load(tmp_path / "g")
    header.write_text(json.dumps({"format": "coordl-graph", "version": 99}))
    with pytest.raises(GraphFormatError, match="version 99"):
        Graph.load(tmp_path / "g")


def test_inconsistent_indptr_named(tiny, tmp_path):
    tiny.save(tmp_path / "g")
    f = tmp_path / "g" / "indptr.bin"
    arr = np.fromfile(f, dtype="<i8")
    arr[-1] = 3
    arr.tofile(f)
    with pytest.raises(GraphFormatError, match="indptr must run from 0 to num_edges=8"):
        Graph.load(tmp_path / "g")


def test_corrupt_pt_file_named(tmp_path):
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    with pytest.raises(GraphFormatError, match=r"bad\.pt: cannot read"):
        Graph.load(tmp_path / "bad.pt")
