"""Finding a DALI pipeline's files from its reader operators' arguments (no DALI needed)."""

from __future__ import annotations

from dsanalyzer.jobs.dali_readers import Op, _argument, _op_def, prep_device, reader_files


def _touch(path, size: int = 10) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return str(path)


def test_file_root_is_listed_as_fn_readers_file_does(tmp_path):
    jpg = _touch(tmp_path / "a" / "1.JPG")  # the default filters match case-insensitively
    png = _touch(tmp_path / "b" / "deep" / "2.png")
    _touch(tmp_path / "b" / "notes.txt")  # not an image: no default filter matches
    _touch(tmp_path / "top.jpg")  # directly in file_root: not in a class folder
    files, readers = reader_files([Op("readers__File", "Reader", {"file_root": [str(tmp_path)]})])
    assert files == [jpg, png]
    assert readers == [{"name": "Reader", "op": "readers__File", "arguments": ["file_root"], "files": 2}]


def test_file_filters_and_dir_filters_are_applied(tmp_path):
    keep = _touch(tmp_path / "train" / "x.bin")
    _touch(tmp_path / "train" / "y.jpg")
    _touch(tmp_path / "val" / "z.bin")
    args = {"file_root": [str(tmp_path)], "file_filters": ["*.bin"], "dir_filters": ["tr*"]}
    assert reader_files([Op("readers__File", "r", args)])[0] == [keep]


def test_file_list_names_are_relative_to_file_root_or_the_list(tmp_path):
    a = _touch(tmp_path / "d" / "cute kitten.jpg")
    b = _touch(tmp_path / "d" / "dog.jpg")
    listing = tmp_path / "d" / "list.txt"
    listing.write_text("cute kitten.jpg 1\ndog.jpg 0\n\n")
    assert reader_files([Op("readers__File", "r", {"file_list": [str(listing)]})])[0] == [a, b]
    args = {"file_list": [str(listing)], "file_root": [str(tmp_path / "d")]}
    assert reader_files([Op("readers__File", "r", args)])[0] == [a, b]


def test_files_paths_and_non_readers(tmp_path):
    a = _touch(tmp_path / "x" / "a.jpg")
    shard = _touch(tmp_path / "shards" / "train-0.tfrecord")
    ops = [
        Op("readers__File", "r1", {"file_root": [str(tmp_path / "x")], "files": ["a.jpg", "missing.jpg"]}),
        Op("readers__TFRecord", "r2", {"path": [str(tmp_path / "shards")]}),
        Op("decoders__Image", "d", {"device": ["mixed"]}),
    ]
    files, readers = reader_files(ops)
    assert files == [a, shard]  # a listed file that does not exist is left out
    assert [r["name"] for r in readers] == ["r1", "r2"]
    assert prep_device(ops) == "gpu" and prep_device(ops[:2]) == "cpu"


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_dali_proto_arguments_are_read():
    # dali_proto.Argument: a scalar string, a vector of strings (extra_args), a bool
    root = _field(1, b"file_root") + _field(2, b"string") + _field(5, b"/data/train")
    element = _field(1, b"element 0") + _field(5, b"x.jpg")
    files = _field(1, b"files") + _field(7, element) + _field(7, element.replace(b"x", b"y")) + _field(8, 1)
    flag = _field(1, b"random_shuffle") + _field(6, 1)
    assert _argument(root) == ("file_root", ["/data/train"])
    assert _argument(files) == ("files", ["x.jpg", "y.jpg"])
    op = _op_def(_field(1, b"readers__File") + _field(4, root) + _field(4, flag) + _field(5, b"Reader"))
    assert op == Op("readers__File", "Reader", {"file_root": ["/data/train"], "random_shuffle": [1]})
