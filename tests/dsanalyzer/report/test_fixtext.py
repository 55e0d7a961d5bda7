"""``dsanalyzer fix``'s table: one row per round, the kept and the reverted, and the speedup over yours."""

from __future__ import annotations

from dsanalyzer.report.fixtext import fix_text


def _row(
    n: int, change: str, predicted: float, before: float, after: float, status: str, speedup: float
) -> dict:
    return {"round": n, "change": change, "predicted_samples_per_s": predicted, "before_samples_per_s": before,
            "measured_samples_per_s": after, "status": status, "speedup": speedup}  # fmt: skip


def _result(rounds: list[dict], speedup: float, patch: str | None = "--- a/t.py\n+++ b/t.py\n") -> dict:
    out = {"plan": [{}], "dry_run": False, "cpus": 2, "predicted_samples_per_s": 90.0, "bound": "prep",
           "base_samples_per_s": 100.0, "rounds": rounds, "speedup": speedup, "final_samples_per_s": 200.0,
           "runs": 3, "iters": 40, "warmup_iters": 68}  # fmt: skip
    if patch is not None:
        out["patch"] = patch
    return out


def test_each_round_is_a_row_and_the_reverted_one_says_so():
    rounds = [
        _row(1, "torch.set_num_threads(1)", 126, 100, 200, "kept", 2.0),
        _row(2, "DataLoader(..., num_workers=3)", 300, 210, 190, "reverted", 1.81),
    ]
    text = fix_text(_result(rounds, 2.0))
    lines = text.splitlines()
    assert lines[1].split() == [
        "round",
        "change",
        "predicted",
        "measured",
        "kept",
        "alone",
        "vs",
        "yours",
        "result",
    ]
    assert lines[3].split()[-2:] == ["2.00x", "kept"] and lines[4].split()[-2:] == ["1.81x", "reverted"]
    assert "final: 2.00x your configuration (200 vs 100 samples/s)" in text and "the change to keep:" in text
    rounds[0]["predicted_bound"] = "prep"
    stopped = fix_text({**_result(rounds[:1], 2.0), "stopped": "no further step"})
    assert "then prep-bound by the model: no further change" in stopped


def test_two_kept_rounds_chain_their_ratios_and_nothing_kept_keeps_the_script():
    rounds = [_row(1, "a", 1, 100, 150, "kept", 1.5), _row(2, "b", 1, 160, 200, "kept", 1.875)]
    assert "1.88x your configuration (the kept rounds' ratios multiplied" in fix_text(_result(rounds, 1.875))
    worse = fix_text(_result([_row(1, "a", 1, 100, 90, "reverted", 0.9)], 1.0, patch=None))
    assert "keep the script as it is" in worse and "+++" not in worse
