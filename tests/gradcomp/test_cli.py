"""``gradcomp train`` with bad arguments: one line naming the option, exit status 2, no traceback (subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gradcomp.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


#: Bad arguments checked in-process through ``main`` (the same code path, without a torch import per case).
BAD = [
    (["--ratio", "1.5"], "--ratio"),
    (["--ratio", "often"], "--ratio"),
    (["--model", "resnet"], "--model"),
    (["--model", "vgg:wide"], "--model"),
    (["--iters", "0"], "--iters"),
    (["--batch-size", "-4"], "--batch-size"),
    (["--lr", "0"], "--lr"),
    (["--data", "/nonexistent/gradcomp-images"], "--data"),
    (["--baseline", "horovod"], "--baseline"),
    (["--frobnicate"], "--frobnicate"),
]


@pytest.mark.parametrize(
    "argv,option",
    [(["--ratio", "-1"], "--ratio"), (["--compressor", "nope"], "--compressor"), (["--plan", "x"], "--plan")],
)
def test_bad_argument_gives_one_line_naming_it_and_exit_2(argv: list[str], option: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "gradcomp.cli", "train", "--report", "", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert option in lines[0] and "error" in lines[0], lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""


@pytest.mark.parametrize("argv,option", BAD)
def test_bad_argument_is_rejected_while_parsing(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and option in err[0], err


def test_every_train_option_has_a_description() -> None:
    train = build_parser()._subparsers._group_actions[0].choices["train"]  # noqa: SLF001
    undocumented = [a.option_strings for a in train._actions if a.option_strings and not a.help]  # noqa: SLF001
    assert undocumented == []


def test_good_arguments_parse_to_the_documented_defaults() -> None:
    args = build_parser().parse_args(["train"])
    assert (args.compressor, args.ratio, args.plan, args.no_error_feedback) == ("mstopk", 0.01, "auto", False)
    assert args.model == "small" and args.data is None and args.report == "reports/runs/gradcomp-train.json"
    args = build_parser().parse_args(["train", "--ratio", "1", "--model", "vgg:512", "--data", "tensors"])
    assert args.ratio == 1.0 and args.model == "vgg:512" and args.data == "tensors"
