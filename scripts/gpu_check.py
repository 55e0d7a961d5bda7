"""Every GPU claim of the project, measured in one command on a machine with CUDA (``make gpu-check``).

    python3 scripts/gpu_check.py                # on the accelerator machine: under 9 minutes
    python3 scripts/gpu_check.py --only pin,gradcomp
    .venv/bin/python scripts/gpu_check.py --dry-run   # here: every section's wiring on the CPU, tiny sizes

Sections (scripts/gpu/, run in this order, each in its own process group under its own time limit, so
a failure, hang or crash in one is reported and the others still run): the ``gpu``-marked tests;
MSTopK and the compressors on CUDA; pin_memory + non_blocking copies through coordl's batch ring vs
torch; dsanalyzer's profile -> fix -> verify on a GPU job (``dsanalyzer demo``); the what-if's GPU axis
against a lighter model; DALILoader(device="gpu") vs DALI's reader (skipped without DALI). Writes
reports/gpu/<date>-<gpu>.md (the dry run: reports/runs/) and copies it, with the section logs, to $OUT
when that is set. Packages the machine lacks travel as wheels in .whl/ (``make gpu-wheels``) and are
installed into a scratch folder first. Without a CUDA device it exits 2 with one line saying so.
See docs/gpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(1, str(ROOT))

from gpu import SECTIONS  # noqa: E402
from gpu.common import kill_tree  # noqa: E402

SITE = Path("/tmp/coordl-gpu-site")  # where carried wheels are installed
NEEDED = ("simplejpeg", "redis", "hiredis", "lmdb")  # coordl's imports that the accelerator image lacks
EXIT_NO_CUDA, EXIT_SKIPPED, EXIT_TIMEOUT = 2, 3, 4
_BULK = (".jpg", ".jpeg", ".pt", ".whl", ".npy")  # datasets and tensors: not sent back with the logs


def no_cuda_line() -> str | None:
    """One line naming what is missing for a real run, or None when CUDA is usable."""
    try:
        import torch
    except ImportError as e:
        return f"gpu-check: torch is not importable ({e}); run it where torch with CUDA is installed (docs/gpu.md)"
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (f"gpu-check: no CUDA device: torch {torch.__version__} ({build}) sees no GPU; run it on the "
                f"accelerator machine (docs/gpu.md), or --dry-run here")  # fmt: skip
    return None


def install_wheels(wheels: Path) -> str:
    """Install the carried wheels if a needed module is missing; a line for the report."""
    missing = [m for m in NEEDED if not _importable(m)]
    if not missing:
        return "all of " + ", ".join(NEEDED) + " importable without carried wheels"
    files = sorted(str(p) for p in wheels.glob("*.whl")) if wheels.is_dir() else []
    if not files:
        return f"missing {', '.join(missing)} and no wheels in {wheels}/ (make gpu-wheels, then carry it)"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--target", str(SITE), *files]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    _use_site()
    still = [m for m in NEEDED if not _importable(m)]
    status = "installed" if res.returncode == 0 else f"pip failed ({res.stderr.strip()[-300:]})"
    return f"{len(files)} carried wheels {status} into {SITE}" + (
        f"; still missing {', '.join(still)}" if still else ""
    )


def install_crop_decoder(wheels: Path) -> str:
    """coordl's crop decoder built by make gpu-wheels (abi3, with its libjpeg) into coordl/prep/ if it does not
    import here; a line for the report (the loaders fall back to whole-image decodes without it)."""
    if _importable("coordl.prep._cropjpeg"):
        return "built (imports)"
    built = sorted((wheels / "cropjpeg").glob("*")) if (wheels / "cropjpeg").is_dir() else []
    if not built:
        return f"not built, none carried in {wheels}/cropjpeg (whole-image decodes)"
    for f in built:
        shutil.copy(f, ROOT / "coordl" / "prep" / f.name)
    ok = _importable("coordl.prep._cropjpeg")
    return f"carried abi3 build ({', '.join(f.name for f in built)}) " + (
        "imports" if ok else "does NOT import (whole-image decodes)"
    )


def _importable(module: str) -> bool:
    return (
        subprocess.run([sys.executable, "-c", f"import {module}"], env=_env(), capture_output=True).returncode
        == 0
    )


def _use_site() -> None:
    if SITE.is_dir() and str(SITE) not in sys.path:
        sys.path.insert(2, str(SITE))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    extra = [str(ROOT), str(ROOT / "scripts")] + ([str(SITE)] if SITE.is_dir() else [])
    env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- child side: one section ------------------------------------------------------------------------


def run_section(args: argparse.Namespace) -> int:
    """In the section's own process: run it, record skip or error in its JSON, exit 0/1/3."""
    from gpu.common import Context, SectionError, SectionTimeout, Skip

    ctx = Context(args.section, args.device, args.dry_run, Path(args.work), Path(args.result), args.seconds)
    module = _module(args.section)
    try:
        module.run(ctx)
    except Skip as e:
        ctx.data["skip"] = str(e)
        ctx.save()
        return EXIT_SKIPPED
    except SectionTimeout as e:
        ctx.data["timeout"] = str(e)
        ctx.save()
        return EXIT_TIMEOUT
    except SectionError as e:
        ctx.data["error"] = str(e)
        ctx.save()
        return 1
    except Exception:  # noqa: BLE001 - any failure of a section is reported, not raised past it
        ctx.data["error"] = traceback.format_exc(limit=6)
        ctx.save()
        return 1
    return 0


# -- parent side ------------------------------------------------------------------------------------


def _spawn(name: str, args: argparse.Namespace, work: Path, timeout: float) -> dict:
    """Run one section in its own process group; its result dict with status and seconds."""
    module = _module(name)
    result = work / f"{name}.json"
    base = {"name": name, "title": module.TITLE, "budget": max(timeout, 0), "seconds": 0.0}
    if timeout < 10:
        return {
            **base,
            "status": "not run",
            "reason": f"out of time: {timeout:.0f} s left of --budget {args.budget:g}",
        }
    cmd = [sys.executable, __file__, "--section", name, "--result", str(result), "--work", str(work / name),
           "--device", args.device, "--seconds", f"{timeout:.0f}"] + (["--dry-run"] if args.dry_run else [])  # fmt: skip
    print(f"gpu-check: {name}: {module.TITLE} (up to {timeout:.0f} s)", flush=True)
    t0 = time.monotonic()
    with open(work / f"{name}.log", "w") as log:
        proc = subprocess.Popen(
            cmd, env=_env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            kill_tree(proc)
    out = {**base, "seconds": time.monotonic() - t0}
    data = json.loads(result.read_text()) if result.exists() else {}
    out.update({k: data.get(k, []) for k in ("tables", "notes", "commands")})
    if rc is None or rc == EXIT_TIMEOUT:
        running = f"; it was running: {out['commands'][-1]}" if out.get("commands") else ""
        out["status"] = "TIMEOUT"
        out["reason"] = (
            data.get("timeout") or f"stopped after {timeout:.0f} s (its tables are what it finished){running}"
        )
    elif rc == 0:
        out["status"] = "ok"
    elif rc == EXIT_SKIPPED:
        out["status"], out["reason"] = "skipped", data.get("skip", "")
    else:
        tail = (work / f"{name}.log").read_text(errors="replace").strip().splitlines()[-12:]
        out["status"], out["reason"] = "FAILED", data.get("error") or "\n".join(tail)
    print(f"gpu-check: {name}: {out['status']} in {out['seconds']:.0f} s", flush=True)
    return out


def _selected(args: argparse.Namespace) -> list[str]:
    only = [s for s in args.only.split(",") if s] if args.only else list(SECTIONS)
    skip = set(args.skip.split(",")) if args.skip else set()
    unknown = [s for s in [*only, *skip] if s and s not in SECTIONS]
    if unknown:
        sys.exit(f"gpu-check: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    return [s for s in SECTIONS if s in only and s not in skip]


def _deliver(report: Path, work: Path, results: list[dict]) -> list[str]:
    """Copy the report, the raw results and the logs to $OUT (what comes back from the device machine:
    at most 8 files of 16 MiB)."""
    out = os.environ.get("OUT")
    if not out:
        return []
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    if report.resolve() != (dest / report.name).resolve():  # --report may already be under $OUT
        shutil.copy(report, dest / report.name)
    (dest / "gpu-check-results.json").write_text(json.dumps(results, indent=1))
    logs = dest / "gpu-check-logs.tar.gz"
    with tarfile.open(logs, "w:gz") as tar:
        tar.add(work, arcname="gpu-check", filter=lambda t: None if t.name.endswith(_BULK) else t)
    files = [dest / report.name, dest / "gpu-check-results.json", logs]
    if logs.stat().st_size > 15 << 20:
        logs.unlink()
        files.pop()
        print(f"gpu-check: the logs came to over 15 MiB compressed; not copied (they are in {work})")
    return [str(f) for f in files]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dry-run", action="store_true", help="run every section on the CPU with tiny sizes (CI)")
    p.add_argument("--only", default="", help=f"comma-separated sections of: {','.join(SECTIONS)}")
    p.add_argument("--skip", default="", help="comma-separated sections not to run")
    p.add_argument(
        "--budget", type=float, help="seconds for all sections together (default 540; dry run: 1080)"
    )
    p.add_argument(
        "--report",
        type=Path,
        help="report path (default reports/gpu/<date>-<gpu>.md; dry run: reports/runs/)",
    )
    p.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="carried wheels (default .whl/)")
    p.add_argument("--work", type=Path, help="scratch folder (default /tmp/coordl-gpu-check-<time>)")
    p.add_argument("--stash-dali", action="store_true",
                   help="copy the DALI parts this device call carried (.dali/p*/) aside for a later call, and exit")  # fmt: skip
    p.add_argument("--section", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=600, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.section:
        return run_section(args)
    if args.stash_dali:
        from gpu import dali_install

        print(f"gpu-check: {dali_install.stash(ROOT / '.dali')}")
        return 0
    t_start = time.monotonic()
    # the dry run's sizes are tiny but a small shared CI machine is slow: its sections get twice the time
    scale = 2.0 if args.dry_run else 1.0
    args.budget = args.budget if args.budget is not None else 540 * scale
    if args.dry_run:
        args.device = "cpu"
    else:
        line = no_cuda_line()
        if line:
            print(line, file=sys.stderr)
            return EXIT_NO_CUDA
    names = _selected(args)
    wheels_line = install_wheels(args.wheels)
    print(f"gpu-check: {wheels_line}", flush=True)
    # Only on the accelerator machine: a dry run here must not copy a carried build into this tree, or unpack
    # DALI's cp312 files into this interpreter's site-packages.
    skipped = "not installed in a dry run (what this machine has is used)"
    crop_line = install_crop_decoder(args.wheels) if not args.dry_run else skipped
    print(f"gpu-check: crop decoder: {crop_line}", flush=True)
    from gpu import dali_install

    dali_line = dali_install.install(ROOT / ".dali") if not args.dry_run else skipped
    print(f"gpu-check: DALI: {dali_line}", flush=True)
    from gpu.report import machine_info, markdown, report_path

    now = datetime.now()
    work = args.work or Path(f"/tmp/coordl-gpu-check-{now:%Y%m%d-%H%M%S}")
    work.mkdir(parents=True, exist_ok=True)
    machine = {
        **machine_info(ROOT),
        "carried wheels": wheels_line,
        "DALI": dali_line,
        **({} if args.dry_run else {"coordl crop decoder": crop_line}),  # a dry run: machine_info's line
        "budget": f"{args.budget:g} s for the sections",
    }
    gpu = machine["GPU"].split(",")[0]
    default_dir = ROOT / "reports" / ("runs" if args.dry_run else "gpu")
    path = args.report or report_path(default_dir, "cpu-dry-run" if args.dry_run else gpu, now)
    path.parent.mkdir(parents=True, exist_ok=True)
    command = "python3 scripts/gpu_check.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    title = f"GPU check: {gpu}, {now:%Y-%m-%d}" + (
        " (dry run on the CPU: wiring only, not numbers)" if args.dry_run else ""
    )
    results: list[dict] = []
    delivered: list[str] = []
    t_sections = time.monotonic()  # --budget is the sections' time, not the set-up's
    for i, name in enumerate(names):
        left = args.budget - (time.monotonic() - t_sections)
        results.append(_spawn(name, args, work, min(_module(name).BUDGET_S * scale, left - 5)))
        # after every section, so that a run stopped from outside (the device call's limit) still brings back
        # what it measured; the sections still to come are listed as such
        pending = [{"name": n, "title": _module(n).TITLE, "status": "not run yet", "seconds": 0.0, "budget": 0.0}
                   for n in names[i + 1 :]]  # fmt: skip
        path.write_text(markdown(title, command.strip(), machine, results + pending))
        delivered = _deliver(path, work, results)
    # the tables on stdout too (without the commands): the device call's output keeps its last 12,000 characters,
    # a second way back if the files under $OUT do not come
    print("\n" + markdown(title, command.strip(), machine, results, commands=False))
    print(f"gpu-check: report {path} ({time.monotonic() - t_start:.0f} s)")
    for f in delivered:
        print(f"gpu-check: copied to {f}")
    bad = [r["name"] for r in results if r["status"] not in ("ok", "skipped")]
    if bad:
        print(f"gpu-check: not ok: {', '.join(bad)}")
    return 1 if bad else 0


def _module(name: str):
    """The section's module under scripts/gpu/ (imported by name: the sections are a table, SECTIONS)."""
    import importlib

    return importlib.import_module(f"gpu.{SECTIONS[name]}")


if __name__ == "__main__":
    sys.exit(main())
