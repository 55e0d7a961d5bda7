"""Soak: every coordl technique at once, in real processes, under seeded faults; nothing may be lost.

    .venv/bin/python benchmarks/soak/soak.py --minutes 60 --seed 1     # what `make soak` runs

Starts, on this host, at the same time: (a) ``minio``: 2 loader workers and the MinIO cache; (b) ``sample``:
the memcache sample cache on two local Redis nodes; (c) ``coord0`` + ``coord1``: two jobs with coordinated
prep; (d) ``part0`` + ``part1``: a 2-node partitioned job, each rank in its own network namespace (veth
pairs and a bridge, tests/support/netns.py), each with its own Redis; on loopback without root; (e) ``nfs``:
items staged from the user-space NFS server; (f) ``ray``: remote prep on a local Ray cluster (a head and one
prep node, raynodes.py), the Ray node killed and restarted by the ``ray_node_kill`` fault. Each job
(job.py) loops epochs over the same items (items.py), checks every item's id and bytes, logs every batch
and checkpoints its loader ``state_dict()``. For ``--minutes``, faults.Injector injects seeded random
faults, several at once. Then the jobs are stopped, the invariants checked (check.py) and the report
written: ``<report-dir>/soak.json``, ``soak.md``, ``soak.png``. Exit status 0 when the run passed.
Per-job logs stay in ``--logs`` (default ``reports/runs/soak-<seed>``). docs/reliability.md, "Soak".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT)]

import check  # noqa: E402
import psutil  # noqa: E402
import report  # noqa: E402
from faults import Injector  # noqa: E402
from procs import Job, RedisNodes, Supervisor, job_argv  # noqa: E402

WINDOW_S = 10.0  # the recovery window (check.recovery)
# Per job's process tree (the job, its loader workers, its own Redis): ~0.5-0.8 GiB and ~150 fds normally.
RSS_BOUND_MIB, FDS_BOUND = 2048, 1000
WARM_BOUND_S = 180.0  # the longest wait for every job's first batch before the faults start
KINDS = ("minio", "sample", "coord", "part", "nfs", "ray")


def snapshot() -> dict[str, set[str]]:
    netns = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    return {"shm": set(os.listdir("/dev/shm")), "tmp": set(os.listdir(tempfile.gettempdir())), "netns": netns}


class Soak:
    """The running soak: its jobs, Redis nodes, network, supervisor; what the injector acts on."""

    def __init__(self, args: argparse.Namespace, logs: Path, rundir: Path) -> None:
        self.args, self.logs, self.rundir = args, logs, rundir
        self.events = open(logs / "events.jsonl", "a", buffering=1)  # noqa: SIM115
        self.faults: list[dict] = []
        self.samples: list[dict] = []
        self.our_pids: set[int] = set()
        self.our_procs: set[tuple[int, float]] = set()  # (pid, start time): a reused pid is not ours
        self.left_out: list[str] = []
        self.jobs: list[Job] = []
        self.coord_jobs: list[Job] = []
        self.part_jobs: list[Job] = []
        self.redis: RedisNodes | None = None
        self.redis_lock: list[threading.Lock] = []
        self.net: Any = None
        self.nfs: Any = None
        self.nfs_lock = threading.Lock()
        self.ray: Any = None  # raynodes.RayNodes
        self.ray_lock = threading.Lock()
        self.link_lock: list[threading.Lock] = []
        self.part_secret = secrets.token_hex(24)
        self.lock = threading.Lock()

    def event(self, ev: str, **fields: Any) -> None:
        fields.update(ev=ev, t=time.time())
        with self.lock:
            self.events.write(json.dumps(fields, default=str) + "\n")

    def record_fault(self, rec: dict) -> None:
        with self.lock:
            self.faults.append(rec)
        self.event("fault", **rec)

    def worker_jobs(self) -> list[Job]:
        return [j for j in self.jobs if j not in self.part_jobs]

    def sample_job_names(self) -> list[str]:
        return [j.name for j in self.jobs if j.name == "sample"]

    # -- start ---------------------------------------------------------------------------------
    def start(self) -> None:
        a, kinds = self.args, set(self.args.jobs.split(","))
        common = {"n": a.n, "step_s": a.step_s}
        env = {"TMPDIR": str(self.rundir / "tmp")}
        (self.rundir / "tmp").mkdir()
        if "minio" in kinds:
            self.jobs.append(Job("minio", job_argv("minio", "minio", self.logs, a.seed, **common), env=env))
        if "sample" in kinds:
            pw = secrets.token_hex(16)
            self.redis = RedisNodes(2, self.rundir, pw)
            self.redis_lock = [threading.Lock() for _ in self.redis.servers]
            argv = job_argv(
                "sample", "sample", self.logs, a.seed, redis=",".join(self.redis.addresses), **common
            )
            self.jobs.append(Job("sample", argv, env={**env, "MEMCACHE_PASSWORD": pw}))
        if "coord" in kinds:
            gdir = self.rundir / "group"
            gdir.mkdir()
            for i in range(2):
                argv = job_argv("coord", f"coord{i}", self.logs, a.seed, workers=1, group_dir=gdir, **common)
                self.coord_jobs.append(Job(f"coord{i}", argv, env=env))
            self.jobs += self.coord_jobs
        if "part" in kinds:
            self._start_part(env, common)
        if "nfs" in kinds:
            from nfs import NfsStage

            self.nfs = NfsStage(self.rundir, a.n)
            argv = job_argv("nfs", "nfs", self.logs, a.seed, nfs_url=self.nfs.url, stage_dir=self.nfs.stage_dir,
                            **common)  # fmt: skip
            self.jobs.append(Job("nfs", argv, env=env))
            if not self.nfs.mounted:
                self.left_out.append("stage_disk_full (mounting a tmpfs needs root)")
        if "ray" in kinds:
            self._start_ray(env, common)
        for j in self.jobs:
            j.start()
            self.event("start", job=j.name, pid=j.pid)
        self.supervisor = Supervisor(self.jobs, [self.part_jobs] if self.part_jobs else [], self.event,
                                     restart_env=self._part_env)  # fmt: skip
        self.supervisor.start()

    def _start_part(self, env: dict, common: dict) -> None:
        from tests.support.netns import VirtualNetwork, skip_reason

        reason = None if not self.args.no_netns else "--no-netns"
        reason = reason or skip_reason()
        if reason is None:
            self.net = VirtualNetwork(2, rate_mbit=200, prefix="cdlsoak").start()
            self.link_lock = [threading.Lock() for _ in self.net.hosts]
        else:
            self.left_out.append(f"namespaces for the partitioned job ({reason}): its 2 ranks run on loopback, "
                                 "no link_cut")  # fmt: skip
        for r in range(2):
            argv = job_argv("part", f"part{r}", self.logs, self.args.seed, **common)
            host = self.net.hosts[r] if self.net is not None else None
            self.part_jobs.append(Job(f"part{r}", argv, env={**env, "COORDL_PEER_SECRET": self.part_secret},
                                      host=host))  # fmt: skip
        self._part_env(self.part_jobs)
        self.jobs += self.part_jobs

    def _start_ray(self, env: dict, common: dict) -> None:
        from raynodes import RayNodes, skip_reason

        reason = skip_reason()
        if reason is not None:
            self.left_out.append(f"(f) remote prep on a local Ray cluster and ray_node_kill: {reason}")
            return
        self.ray = RayNodes(self.rundir)
        try:
            self.ray.start()
        except BaseException:
            self.ray.stop()
            raise
        self.event("ray_started", address=self.ray.address)
        argv = job_argv(
            "ray", "ray", self.logs, self.args.seed, workers=1, ray_address=self.ray.address, **common
        )
        self.jobs.append(Job("ray", argv, env={**env, **self.ray.job_env()}, host=self.ray.host))

    def _part_env(self, group: list[Job]) -> dict:
        """Per rank: torch.distributed's variables, on a fresh port (a restarted pair rendezvous anew)."""
        if self.net is not None:
            port = self.net.hosts[0].free_port()
            per = {j.name: self.net.dist_env(r, master_port=port) for r, j in enumerate(group)}
        else:
            from memcache.server import free_port

            port = free_port()
            per = {j.name: {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": "2",
                            "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(r), "NODE_RANK": str(r)}
                   for r, j in enumerate(group)}  # fmt: skip
        for j in group:
            j.env.update(per[j.name])
        return {}  # the ranks' own env holds it (Job.start merges Job.env)

    def wait_warm(self, bound_s: float) -> float:
        """Seconds until every job logged a batch (at most ``bound_s``: a job that never starts is reported)."""
        t0 = time.time()
        while time.time() - t0 < bound_s:
            if all(_has_batch(self.logs / f"{j.name}.jsonl") for j in self.jobs):
                break
            time.sleep(1.0)
        self.event("warm", seconds=time.time() - t0)
        return time.time() - t0

    # -- watch ---------------------------------------------------------------------------------
    def monitor(self, halt: threading.Event) -> None:
        while not halt.wait(2.0):
            now = time.time()
            for j in self.jobs:
                rss = fds = 0
                for p in j.tree():
                    try:
                        rss += p.memory_info().rss
                        fds += p.num_fds()
                        self.our_pids.add(p.pid)
                        self.our_procs.add((p.pid, p.create_time()))
                    except psutil.Error:
                        continue
                if rss:
                    self.samples.append({"t": now, "job": j.name, "rss": rss, "fds": fds})
            for name, tree in (self.ray.trees() if self.ray is not None else {}).items():
                rss = fds = 0
                for p in tree:
                    try:
                        rss, fds = rss + p.memory_info().rss, fds + p.num_fds()
                        self.our_pids.add(p.pid)
                        self.our_procs.add((p.pid, p.create_time()))
                    except psutil.Error:
                        continue
                if rss:
                    self.samples.append({"t": now, "job": name, "rss": rss, "fds": fds})

    def stop(self) -> dict[str, Any]:
        self.supervisor.halt.set()
        self.supervisor.join(10)
        (self.logs / "STOP").touch()
        rcs = {j.name: j.stop(timeout_s=60) for j in self.jobs}
        self.event("stopped", rcs=rcs)
        if self.redis is not None:
            self.redis.stop()
        if self.net is not None:
            self.net.close()
        if self.nfs is not None:
            self.nfs.stop()
        if self.ray is not None:
            self.ray.stop()
        return rcs


def _has_batch(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return b'"ev": "batch"' in f.read(1 << 16)
    except FileNotFoundError:
        return False


def cleanup_left(before: dict[str, set[str]], soak: Soak, rundir: Path) -> dict[str, Any]:
    """What the run left: /dev/shm and temp entries naming one of its pids, processes, namespaces, files."""
    after = snapshot()
    ours = {str(p) for p in soak.our_pids}

    def mine(name: str) -> bool:
        return any(part in ours for part in name.replace(".", "-").split("-"))

    procs = []
    me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] in me:
            continue
        if (
            (p.info["pid"], p.info["create_time"]) in soak.our_procs
            or f"--dir {soak.logs}" in cmd
            or str(rundir) in cmd
        ):
            procs.append(f"{p.info['pid']} {cmd[:120]}")
    kept = [
        rundir / d for d in ("redis0", "redis1", "export", "stage", "ray")
    ]  # the driver's own, removed below
    left_files = [str(f.relative_to(rundir)) for f in rundir.rglob("*")
                  if f.is_file() and not any(f.is_relative_to(k) for k in kept)]  # fmt: skip
    return {"shm_left": sorted(n for n in after["shm"] - before["shm"] if mine(n)),
            "tmp_left": sorted(n for n in after["tmp"] - before["tmp"] if mine(n)) + left_files,
            "procs_left": procs, "netns_left": sorted(n for n in after["netns"] - before["netns"] if "cdlsoak" in n),
            "shm_new_any_owner": len(after["shm"] - before["shm"])}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    logs = Path(args.logs or ROOT / "reports" / "runs" / f"soak-{args.seed}")
    if logs.exists():
        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    before = snapshot()
    rundir = Path(tempfile.mkdtemp(prefix="coordl-soak-"))
    soak = Soak(args, logs, rundir)
    halt = threading.Event()
    t0 = time.time()
    try:
        soak.start()
        threading.Thread(target=soak.monitor, args=(halt,), daemon=True).start()
        warm_s = soak.wait_warm(WARM_BOUND_S)  # faults start once every job delivers batches
        injector = Injector(args.seed, soak, soak.record_fault, mean_gap_s=args.mean_gap_s)
        injector.start()
        deadline = time.time() + args.minutes * 60
        while time.time() < deadline:
            time.sleep(1.0)
        injector.drain()
        fault_end = time.time()
        time.sleep(args.settle_s)  # every job runs fault-free before the stop: the rates recover
        run_end = time.time()
    finally:
        halt.set()
        rcs = soak.stop() if hasattr(soak, "supervisor") else {}
    time.sleep(2.0)  # the killed trees' last children exit (PR_SET_PDEATHSIG)
    left = cleanup_left(before, soak, rundir)
    shutil.rmtree(rundir, ignore_errors=True)
    logs_by_job = {j.name: check.read_jsonl(logs / f"{j.name}.jsonl") for j in soak.jobs}
    pairs = [[j.name for j in soak.part_jobs]] if soak.part_jobs else []
    inv = check.check_jobs(logs_by_job, args.n, pairs)
    check.recovery(soak.faults, inv["times"], run_end, WINDOW_S)
    faults = check.summarize_faults(soak.faults)
    res = check.resources(soak.samples)
    failures = []
    for k in ("lost", "duplicated", "wrong_items", "foreign", "diverged_replays"):
        if inv["total"].get(k, 0):
            failures.append(f"{inv['total'][k]} {k}")
    for name, j in inv["jobs"].items():
        if j["complete_epochs"] == 0:
            failures.append(f"{name}: no complete epoch")
    for name, rc in rcs.items():
        if rc not in (0, None):
            failures.append(f"{name} exited {rc} at the stop")
    for (
        name,
        rs,
    ) in res.items():  # absolute bounds: a leak over an hour passes them, a job's normal tree does not
        if rs["rss_mib_max"] > RSS_BOUND_MIB or rs["fds_max"] > FDS_BOUND:
            failures.append(f"{name}: RSS {rs['rss_mib_max']} MiB / {rs['fds_max']} fds over the bound")
    for k in ("shm_left", "tmp_left", "procs_left", "netns_left"):
        if left[k]:
            failures.append(f"{k}: {left[k][:5]}")
    times = inv.pop("times")
    result = {
        "command": " ".join(["soak.py", *sys.argv[1:]]) if args.command is None else args.command,
        "host": f"{platform.node()} ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})",
        "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0)), "seed": args.seed,
        "minutes": (fault_end - t0 - warm_s) / 60, "warm_s": round(warm_s, 1), "window_s": WINDOW_S,
        "settle_s": args.settle_s,
        "jobs": {j.name: f"{j.argv[j.argv.index('--kind') + 1]}, started {j.starts}x" for j in soak.jobs},
        "left_out": soak.left_out + args.left_out, "passed": not failures, "failures": failures,
        "passed_items": not any(inv["total"].get(k, 0) for k in ("lost", "duplicated", "wrong_items")),
        "invariants": inv, "faults": faults, "fault_log": soak.faults, "resources": res, "cleanup": left,
        "exit_codes": rcs,
        "ray": report.ray_summary(logs_by_job["ray"], soak.ray.node_starts) if soak.ray is not None else None,
    }  # fmt: skip
    out = Path(args.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(result, out / "soak.json")
    (out / "soak.md").write_text(report.markdown(result))
    report.plot(times, soak.faults, t0, out / "soak.png")
    return result


def left_out(kinds: set[str]) -> list[str]:
    if "ray" in kinds:
        return []
    return ["(f) remote prep on a local Ray cluster and ray_node_kill: not in --jobs (the CI form leaves it to "
            "`make soak`: a Ray head and node cost ~1 GB and most of a core on a 2-core host)"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", default=",".join(KINDS), help=f"comma-separated, of {KINDS}")
    p.add_argument("--n", type=int, default=240, help="items in the dataset (even: the pair's shards)")
    p.add_argument("--step-s", type=float, default=0.05, help="the training step each batch stands for")
    p.add_argument("--mean-gap-s", type=float, default=12.0, help="mean time between fault starts")
    p.add_argument("--settle-s", type=float, default=30.0, help="fault-free time before the stop")
    p.add_argument("--no-netns", action="store_true", help="the partitioned ranks on loopback")
    p.add_argument("--report-dir", default=str(ROOT / "reports"))
    p.add_argument("--logs", default=None)
    p.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.left_out = left_out(set(args.jobs.split(",")))
    unknown = set(args.jobs.split(",")) - set(KINDS)
    if unknown:
        p.error(f"--jobs: unknown {sorted(unknown)}; choose from {KINDS}")
    if args.n % 2:
        p.error(f"--n must be even (the partitioned pair's shards), got {args.n}")
    result = run(args)
    print(report.markdown(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
