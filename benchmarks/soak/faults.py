"""The soak's fault injector: seeded random faults, several at once, each logged with its start and end.

:class:`Injector` draws every choice (when the next fault starts, its kind, its target, how long it
lasts) from ``random.Random(seed)``; what the draws hit depends on the processes' timing (which worker
is mid-batch), so two runs of one seed inject the same sequence of kinds, targets and durations, not the
same byte-for-byte outcome. At most ``max_overlap`` faults run at once, each in its own thread.

Kinds (those whose target is not running are left out of the draw):

| kind | what | ends when |
|---|---|---|
| ``worker_kill`` | SIGKILL one loader worker of a job | at once (the job's loader raises, it resumes) |
| ``redis_kill`` | SIGKILL a sample-cache Redis node, restart it on its port after 5-15 s | restarted |
| ``redis_stop`` | SIGSTOP a sample-cache Redis node for 5-15 s, then SIGCONT | continued |
| ``part_redis_stop`` | SIGSTOP a partitioned rank's own Redis for 5-15 s | continued |
| ``part_redis_kill`` | SIGKILL a partitioned rank's own Redis (back when the pair restarts) | at once |
| ``link_cut`` | ``ip link set down`` a partitioned rank's namespace link for 10-30 s | link up |
| ``wrong_value`` | store wrong values under real keys of a cache's Redis (corrupt.py) | at once |
| ``job_kill`` | SIGKILL a whole job process (a partitioned rank: the pair restarts) | at once |
| ``coord_job_kill`` | SIGKILL one coordinated job mid-epoch | at once |
| ``stage_disk_full`` | fill the NFS job's stage disk (tmpfs), remove 10 staged copies, 10-30 s | freed |
| ``staged_corrupt`` | change one byte of 5 staged copies (same size) | at once |
| ``ray_node_kill`` | SIGKILL the Ray prep node's every process (raylet, workers, the actor), restart the
  node after 5-15 s | restarted |
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class Injector(threading.Thread):
    def __init__(
        self, seed: int, ctx: Any, record, *, mean_gap_s: float = 12.0, max_overlap: int = 3
    ) -> None:
        super().__init__(daemon=True, name="soak-injector")
        self.rng = random.Random(seed)
        self.ctx, self.record = ctx, record  # ctx: soak.Soak (jobs, redis nodes, network)
        self.mean_gap_s, self.max_overlap = mean_gap_s, max_overlap
        self.halt = threading.Event()
        self.running: list[threading.Thread] = []

    def kinds(self) -> list[str]:
        c = self.ctx
        k = ["worker_kill", "job_kill"]
        if c.redis is not None:
            k += ["redis_kill", "redis_stop", "wrong_value"]
        if c.coord_jobs:
            k += ["coord_job_kill"]
        if c.nfs is not None:
            k += ["staged_corrupt"] + (["stage_disk_full"] if c.nfs.mounted else [])
        if c.ray is not None:
            k += ["ray_node_kill"]
        if c.part_jobs:
            k += ["part_redis_stop", "part_redis_kill", "wrong_value"]
            if c.net is not None:
                k += ["link_cut"]
        return k

    def run(self) -> None:
        time.sleep(self.rng.uniform(3, 8))  # the jobs deliver batches already (soak.wait_warm)
        while not self.halt.is_set():
            self.running = [t for t in self.running if t.is_alive()]
            if len(self.running) < self.max_overlap:
                kind = self.rng.choice(self.kinds())
                plan = {"kind": kind, "seed": self.rng.randrange(1 << 30), "hold_s": self.rng.uniform(5, 15)}
                if kind in ("link_cut", "stage_disk_full"):
                    plan["hold_s"] = self.rng.uniform(10, 30)
                t = threading.Thread(target=self._one, args=(plan,), daemon=True)
                t.start()
                self.running.append(t)
            self.halt.wait(self.rng.expovariate(1.0 / self.mean_gap_s))

    def drain(self, timeout_s: float = 60.0) -> None:
        """Stop drawing, and wait for the faults in flight to end (Redis continued, links up)."""
        self.halt.set()
        self.join(timeout_s)
        for t in self.running:
            t.join(timeout_s)

    def _one(self, plan: dict) -> None:
        rng = random.Random(plan["seed"])
        rec: dict[str, Any] = {"kind": plan["kind"], "start": time.time()}
        try:
            rec.update(getattr(self, "_" + plan["kind"])(rng, plan["hold_s"]))
        except Exception as e:  # the fault could not be injected: reported, not hidden
            rec["error"] = f"{type(e).__name__}: {e}"
        rec["end"] = time.time()
        self.record(rec)

    # -- the faults ------------------------------------------------------------------------------

    def _worker_kill(self, rng: random.Random, hold_s: float) -> dict:
        jobs = [j for j in self.ctx.worker_jobs() if j.workers()]
        if not jobs:
            return {"skipped": "no job had a loader worker running"}
        job = rng.choice(jobs)
        victim = rng.choice(job.workers())
        os.kill(victim.pid, signal.SIGKILL)
        return {"jobs": [job.name], "pid": victim.pid}

    def _job_kill(self, rng: random.Random, hold_s: float) -> dict:
        job = rng.choice([j for j in self.ctx.jobs if j.alive()])
        os.kill(job.pid, signal.SIGKILL)  # the supervisor restarts it from its last checkpoint
        names = [j.name for j in self.ctx.part_jobs] if job in self.ctx.part_jobs else [job.name]
        return {"jobs": names, "target": job.name, "pid": job.pid}

    def _coord_job_kill(self, rng: random.Random, hold_s: float) -> dict:
        job = rng.choice(self.ctx.coord_jobs)
        if not job.alive():
            return {"skipped": f"{job.name} was not running"}
        os.kill(job.pid, signal.SIGKILL)
        return {"jobs": [j.name for j in self.ctx.coord_jobs], "target": job.name, "pid": job.pid}

    def _stage_disk_full(self, rng: random.Random, hold_s: float) -> dict:
        with self.ctx.nfs_lock:
            detail = self.ctx.nfs.fill(rng, remove=10)
            try:
                time.sleep(hold_s)
            finally:
                self.ctx.nfs.unfill()
        return {"jobs": ["nfs"], **detail}

    def _staged_corrupt(self, rng: random.Random, hold_s: float) -> dict:
        with self.ctx.nfs_lock:
            return {"jobs": ["nfs"], **self.ctx.nfs.corrupt(rng, count=5)}

    def _ray_node_kill(self, rng: random.Random, hold_s: float) -> dict:
        with self.ctx.ray_lock:
            pids = self.ctx.ray.kill_node()
            time.sleep(hold_s)
            self.ctx.ray.restart_node()
        return {"jobs": ["ray"], "pids": len(pids), "down_s": round(hold_s, 1)}

    def _redis_kill(self, rng: random.Random, hold_s: float) -> dict:
        nodes = self.ctx.redis
        i = rng.randrange(len(nodes.servers))
        with self.ctx.redis_lock[i]:
            os.kill(nodes.servers[i].pid, signal.SIGKILL)
            time.sleep(hold_s)
            nodes.restart(i)
        return {"jobs": self.ctx.sample_job_names(), "node": i}

    def _redis_stop(self, rng: random.Random, hold_s: float) -> dict:
        nodes = self.ctx.redis
        i = rng.randrange(len(nodes.servers))
        with self.ctx.redis_lock[i]:
            pid = nodes.servers[i].pid
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(hold_s)
            finally:
                os.kill(pid, signal.SIGCONT)
        return {"jobs": self.ctx.sample_job_names(), "node": i}

    def _part_redis(self, rng: random.Random) -> tuple[Any, Any]:
        ranks = [j for j in self.ctx.part_jobs if j.redis()]
        if not ranks:
            return None, None
        job = rng.choice(ranks)
        return job, job.redis()[0]

    def _part_redis_stop(self, rng: random.Random, hold_s: float) -> dict:
        with self.ctx.supervisor.lock:  # the pair is not restarted under a stopped Redis
            job, proc = self._part_redis(rng)
            if job is None:
                return {"skipped": "no partitioned rank had its Redis running"}
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            time.sleep(hold_s)
        finally:
            try:
                os.kill(proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        return {"jobs": [j.name for j in self.ctx.part_jobs], "target": job.name}

    def _part_redis_kill(self, rng: random.Random, hold_s: float) -> dict:
        job, proc = self._part_redis(rng)
        if job is None:
            return {"skipped": "no partitioned rank had its Redis running"}
        os.kill(proc.pid, signal.SIGKILL)
        return {"jobs": [j.name for j in self.ctx.part_jobs], "target": job.name}

    def _link_cut(self, rng: random.Random, hold_s: float) -> dict:
        h = rng.randrange(len(self.ctx.net.hosts))
        host = self.ctx.net.hosts[h]
        with self.ctx.link_lock[h]:
            host.run(["ip", "link", "set", host.ifname, "down"])
            try:
                time.sleep(hold_s)
            finally:
                host.run(["ip", "link", "set", host.ifname, "up"])
        return {"jobs": [j.name for j in self.ctx.part_jobs], "host": h}

    def _wrong_value(self, rng: random.Random, hold_s: float) -> dict:
        targets: list[tuple[str, Any]] = []
        if self.ctx.redis is not None:
            targets += [("sample", i) for i in range(len(self.ctx.redis.servers))]
        targets += [("part", j) for j in self.ctx.part_jobs]
        which, t = rng.choice(targets)
        env = {**os.environ, "PYTHONPATH": str(HERE.parents[1])}
        argv = [
            sys.executable,
            str(HERE / "corrupt.py"),
            "--count",
            "6",
            "--seed",
            str(rng.randrange(1 << 30)),
        ]
        if which == "sample":
            with self.ctx.redis_lock[t]:  # not while a redis_kill holds the node down
                env["SOAK_REDIS_PASSWORD"] = self.ctx.redis.password
                argv += [self.ctx.redis.servers[t].address, "--pattern", "mc1:*",
                         "--modes", "swap,flip,flip_payload,junk"]  # fmt: skip
                res = _run_here(argv, env)
            jobs = self.ctx.sample_job_names()
        else:
            procs = t.redis()
            if not procs:
                return {"skipped": f"{t.name} had no Redis running"}
            # a self-started Redis's password is the job secret's UTF-8 bytes in hex (partitioned/tier.py)
            env["SOAK_REDIS_PASSWORD"] = self.ctx.part_secret.encode().hex()
            argv += [_redis_address(procs[0]), "--pattern", "cdl1:*", "--modes", "swap,flip,junk"]
            res = t.host.run(argv, env=env, check=False) if t.host is not None else _run_here(argv, env)
            jobs = [j.name for j in self.ctx.part_jobs]
        out = (res.stdout or "").strip().splitlines()
        detail = json.loads(out[-1]) if out else {"error": (res.stderr or "")[-500:]}
        if "changed" in detail and not detail["changed"]:
            return {"skipped": f"{which} cache: fewer than 2 keys stored yet"}
        if "error" in detail:
            raise RuntimeError(f"corrupt.py on the {which} cache: {detail['error']}")
        return {"jobs": jobs, "cache": which, "target": getattr(t, "name", t), **detail}


def _run_here(argv: list[str], env: dict) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def _redis_address(proc: Any) -> str:
    """``host:port`` from redis-server's process title (``redis-server 10.1.2.3:41234``)."""
    title = " ".join(proc.cmdline())
    for word in title.split():
        if ":" in word and word.rsplit(":", 1)[1].isdigit():
            return word
    raise RuntimeError(f"no address in redis-server's title {title!r}")
