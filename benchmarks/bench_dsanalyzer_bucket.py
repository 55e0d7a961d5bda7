"""dsanalyzer on a bucket: profile a job that streams from S3, then verify the what-if's predictions for changes.

One command::

    flock -x /tmp/coordl_cpu.lock .venv/bin/python benchmarks/bench_dsanalyzer_bucket.py --delay-ms 10 --runs 3

starts a local S3 server (moto, tests/support/s3server.py) behind a delay proxy (``--delay-ms`` each way, so a
request pays twice that in round trip; ``--rate 100mbit`` also shapes the link, in a network namespace),
uploads ``--items`` small JPEGs, and profiles ``tests/dsanalyzer/bucket_job.py`` (coordl.ImageFolder on
``s3://``, coordl.DataLoader with 2 workers and ``fetch_ahead=1``, a fixed 10 ms step). Then, for each change

* a MinIO cache of half the dataset (``cache_bytes``),
* four read-ahead threads per worker (``fetch_ahead=4``),
* the fix the verdict names,

it prints the what-if's samples/s and runs ``dsanalyzer verify`` ``--runs`` times on the changed job (median),
and the probe's own check (the fitted store's items/s at the loader's concurrency beside the measured). With
``--plain`` it also profiles the same job written without coordl (a torch Dataset that GETs with boto3, torch's
DataLoader) and prints the model's samples/s beside its real run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coordl.datasets.synth import make_dataset  # noqa: E402
from dsanalyzer.model.whatif import Model  # noqa: E402
from dsanalyzer.profiler import profile_command  # noqa: E402
from dsanalyzer.verify import verify_command  # noqa: E402
from tests.support.s3server import S3Server  # noqa: E402

JOB = ROOT / "tests" / "dsanalyzer" / "bucket_job.py"


def job(url: str, **args) -> list[str]:
    cmd = [sys.executable, str(JOB), "--url", url]
    for k, v in args.items():
        cmd += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return cmd


def predicted(model: Model, change: dict) -> float:
    cache = change.get("cache_bytes", 0)
    return model.predict(
        cache, model.cpus, model.storage_bytes_per_s, policy="minio",
        workers=change.get("num_workers", model.workers), fetch_ahead=change.get("fetch_ahead", model.fetch_ahead),
    ).samples_per_s  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=480)
    p.add_argument(
        "--delay-ms", type=float, default=10.0, help="one-way delay of the proxy (round trip: twice)"
    )
    p.add_argument("--rate", default=None, help="shape the link too (e.g. 100mbit; needs root and ip netns)")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--runs", type=int, default=3, help="verify runs per change (the median is compared)")
    p.add_argument("--out", default=None, help="directory for the report and the JSON results")
    p.add_argument("--plain", action="store_true", help="also profile the job as plain torch + boto3")
    a = p.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="bench-dsa-bucket-"))
    data = make_dataset(out / "synth", n=a.items, classes=4, width=64, height=48, seed=0, workers=1)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cpus; uptime: {uptime}")
    with S3Server(delay_ms=a.delay_ms, netns=a.rate is not None, rate=a.rate, auth=False) as srv:
        srv.create_bucket("data")
        srv.upload_dir(data, "data", "train")
        os.environ.update(srv.env())
        os.environ["COORDL_CACHE_DIR"] = str(out / "coordl-cache")
        url = "s3://data/train"
        t0 = time.time()
        report = profile_command(
            job(url, workers=2, fetch_ahead=1),
            out_dir=out / "profile",
            iters=a.iters,
            warmup=5,
            show_progress=False,
        )
        print(f"profile: {time.time() - t0:.0f} s; {report['advice']}")
        model = Model.from_report(report)
        src = report["source"]
        check = src["check"]
        print(
            f"source: {src['url']} at {src['endpoint']}, {src['objects']} objects, {src['mean_object_bytes']:.0f} B mean"
        )
        print(f"store: {json.dumps(src['model'])}")
        print(
            f"probe check at {check['concurrency']} in flight: model {check['predicted_items_per_s']:.1f} items/s, "
            f"measured {check['measured_items_per_s']:.1f} ({check['error']:+.1%}, window spread ±{check['spread']:.0%})"
        )
        observed = report["rates_per_s"]["observed"]
        print(
            f"profiled job: model {model.predict_measured().samples_per_s:.1f} samples/s, real run {observed:.1f}"
        )
        fix = (report.get("verdict") or {}).get("fix") or {}
        changes = [
            ("MinIO cache, half the dataset", {"cache_bytes": int(model.dataset_bytes / 2)}),
            ("fetch_ahead=4", {"fetch_ahead": 4}),
        ]
        if fix.get("change"):
            changes.append((f"the verdict's fix {fix['code']}", dict(fix["change"])))
        rows = []
        for name, change in changes:
            args = {"workers": change.get("num_workers", 2), "fetch_ahead": change.get("fetch_ahead", 1),
                    "cache_bytes": change.get("cache_bytes", 0)}  # fmt: skip
            v = verify_command(
                out / "profile", job(url, **args), iters=a.iters, runs=a.runs, show_progress=False
            )
            rows.append({"change": name, "args": args, "predicted": v["predicted_samples_per_s"],
                         "predicted_bound": v["predicted_bound"], "measured": v["measured_samples_per_s"],
                         "range": v["measured_range"], "error": v["error"], "note": v.get("note", "")})  # fmt: skip
            assert (
                abs(v["predicted_samples_per_s"] - predicted(model, change))
                < 1e-6 * v["predicted_samples_per_s"]
            )
        plain = None
        if a.plain:
            rep = profile_command(job(url, workers=2, plain=True), out_dir=out / "plain", iters=a.iters, warmup=5,
                                  show_progress=False)  # fmt: skip
            pm = Model.from_report(rep).predict_measured()
            plain = {"predicted": pm.samples_per_s, "bound": pm.bound, "observed": rep["rates_per_s"]["observed"],
                     "measured_bound": rep["bound"], "advice": rep["advice"]}  # fmt: skip
    print("\n| change | predicted samples/s (bound) | measured, median of runs (range) | error |")
    print("|---|---|---|---|")
    print(f"| none (the profiled job) | {model.predict_measured().samples_per_s:,.1f} | {observed:,.1f} (profile's real run) | "
          f"{observed / model.predict_measured().samples_per_s - 1:+.1%} |")  # fmt: skip
    for r in rows:
        print(
            f"| {r['change']} | {r['predicted']:,.1f} ({r['predicted_bound']}) | {r['measured']:,.1f} "
            f"({r['range'][0]:,.1f}-{r['range'][1]:,.1f}) | {r['error']:+.1%} |"
        )
        if r["note"]:
            print(f"  note: {r['note']}")
    if plain is not None:
        print(
            f"| plain torch + boto3 (profiled as is) | {plain['predicted']:,.1f} ({plain['bound']}) | "
            f"{plain['observed']:,.1f} (profile's real run; stalls as measured: {plain['measured_bound']}) | "
            f"{plain['observed'] / plain['predicted'] - 1:+.1%} |"
        )
    (out / "results.json").write_text(
        json.dumps({"source": src, "rows": rows, "observed": observed, "plain": plain}, indent=1)
    )
    print(f"\nreport: {out / 'profile' / 'report.html'}; results: {out / 'results.json'}")
    print(f"uptime after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
