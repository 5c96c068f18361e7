"""The multi-node pre-flight (issue 50): what a group needs from its nodes, checked on them with the
serving image and the group's own pod contract before a model spends hours of GPU time failing to
start. `vllm-platform preflight <stack> --model <name>` renders the Job that runs it
(components/preflight.py); docs/multi-node.md, "Pre-flight", says how to read it.

Runs in the serving image with its own Python (the standard library and torch only). One pod per
node; in each pod:

    python3 vllm_platform_preflight.py node --nodes N --processes-per-node G --leader-address A ...

reports the node's facts (`ulimit -l`, `fi_info -p efa`, the EFA devices the kernel shows, huge
pages), then starts `torch.distributed.run` (torchrun) with G processes, rank `JOB_COMPLETION_INDEX`
of N nodes, the leader at A. Every process joins one world (NCCL on GPUs, gloo on CPUs), all-reduces
a buffer that the rank-0 process times and checks, and the first process of each node reads which
network NCCL chose from NCCL's own log. Rank 0 prints the bus bandwidth as nccl-tests defines it
(bytes / time x 2(n-1)/n) and fails below `--min-bus-bandwidth-gbps`. A node exits 1 when any of its
checks failed or torchrun did; so does the Job. Every check prints one `PASS`/`FAIL` line, and each
node one JSON line after REPORT_PREFIX.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

REPORT_PREFIX = "vllm-platform-preflight: "
INDEX_ENV = "JOB_COMPLETION_INDEX"
"""The pod's index in its Indexed Job (the Job controller sets it): this node's rank."""
EFA_NETWORK = "AWS Libfabric"
"""The network aws-ofi-nccl registers with NCCL (components/leader_worker_set.py NCCL_NETWORK)."""
FI_INFO_PATHS = ("/opt/amazon/efa/bin/fi_info",)
"""Where AWS's EFA installer puts `fi_info` when it is not on PATH."""
NCCL_LOG_NAME = "nccl-preflight.%h.%p.log"
NCCL_LINE_PATTERNS = (
    re.compile(r"NCCL version .*"),
    re.compile(r"NET/Plugin.*"),
    re.compile(r"NET/OFI.*"),
    re.compile(r"Using network .*"),
)
NETWORK_PATTERN = re.compile(r"Using network (.+?)\s*$")
COMMAND_SECONDS = 60


def check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return {"name": name, "ok": ok, "detail": detail}


# --- a node's facts ---------------------------------------------------------------------------------


def locked_memory() -> dict[str, Any]:
    """`ulimit -l` of this container (soft and hard), in KiB or "unlimited"."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)

    def shown(value: int) -> str | int:
        return "unlimited" if value == resource.RLIM_INFINITY else value // 1024

    return {"soft_kib": shown(soft), "hard_kib": shown(hard)}


def fi_info_efa() -> dict[str, Any]:
    """`fi_info -p efa -t FI_EP_RDM`: libfabric's EFA provider and the devices (domains) it opens."""
    program = shutil.which("fi_info") or next((p for p in FI_INFO_PATHS if Path(p).is_file()), None)
    if program is None:
        return {"found": False, "error": "fi_info is not in this image (no libfabric)", "domains": []}
    try:
        result = subprocess.run(
            [program, "-p", "efa", "-t", "FI_EP_RDM"],
            capture_output=True,
            text=True,
            timeout=COMMAND_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"found": True, "path": program, "error": str(error), "domains": []}
    domains = sorted(set(re.findall(r"^\s*domain:\s*(\S+)", result.stdout, flags=re.MULTILINE)))
    facts: dict[str, Any] = {
        "found": True,
        "path": program,
        "returncode": result.returncode,
        "domains": domains,
    }
    if result.returncode != 0:
        facts["error"] = (result.stderr or result.stdout).strip()[-500:]
    return facts


def kernel_efa_devices() -> list[str]:
    """The RDMA devices the kernel shows this container (EFA's are `rdmap*`)."""
    folder = Path("/sys/class/infiniband")
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def huge_pages() -> dict[str, Any]:
    meminfo = Path("/proc/meminfo")
    text = meminfo.read_text() if meminfo.is_file() else ""
    found = dict(re.findall(r"^(HugePages_Total|HugePages_Free|Hugepagesize):\s*(\S+)", text, re.MULTILINE))
    return {**found, "FI_EFA_USE_HUGE_PAGE": os.environ.get("FI_EFA_USE_HUGE_PAGE")}


def node_facts(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "hostname": socket.gethostname(),
        "locked_memory": locked_memory(),
        "fi_info": fi_info_efa(),
        "kernel_rdma_devices": kernel_efa_devices(),
        "huge_pages": huge_pages(),
        "environment": {
            name: value
            for name, value in sorted(os.environ.items())
            if name.startswith(("FI_", "NCCL_", "LD_LIBRARY_PATH"))
        },
    }


def node_checks(facts: dict[str, Any], require_efa: bool, efa_devices: int) -> list[dict[str, Any]]:
    """The node's own checks: only where the group uses EFA (`--require-efa`) is each a condition."""
    memlock = facts["locked_memory"]["soft_kib"]
    fi_info = facts["fi_info"]
    if not require_efa:
        return [check("locked memory", True, f"ulimit -l {memlock} (no EFA asked for: not a condition)")]
    checks = [
        check(
            "locked memory",
            memlock == "unlimited",
            f"ulimit -l {memlock}"
            + (
                ""
                if memlock == "unlimited"
                else ": libfabric's EFA provider needs unlimited (the node's "
                "container runtime limit; docs/multi-node.md, 'Locked memory')"
            ),
        )
    ]
    domains = fi_info["domains"]
    if not fi_info["found"]:
        checks.append(check("libfabric EFA provider", False, fi_info["error"] + ": the image carries no EFA"))
    else:
        ok = "error" not in fi_info and len(domains) >= efa_devices
        detail = f"fi_info -p efa found {len(domains)} device(s) {domains}, the pod asks for {efa_devices}"
        if "error" in fi_info:
            detail += f"; {fi_info['error']}"
        checks.append(check("libfabric EFA provider", ok, detail))
    return checks


# --- the node: facts, then torchrun -----------------------------------------------------------------


def run_node(args: argparse.Namespace) -> int:
    index = int(os.environ.get(INDEX_ENV, "0"))
    facts = node_facts(index)
    checks = node_checks(facts, args.require_efa, args.efa_devices)
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.backend == "nccl":
        # NCCL says which network it chose only at INFO; into a file, so that it can be read back.
        env.update(
            NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=str(log_dir / NCCL_LOG_NAME)
        )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={args.nodes}",
        f"--nproc-per-node={args.processes_per_node}",
        f"--node-rank={index}",
        f"--master-addr={args.leader_address}",
        f"--master-port={args.port}",
        f"--rdzv-conf=timeout={args.rendezvous_seconds}",
        "--max-restarts=0",
        str(Path(__file__).resolve()),
        "rank",
        *_rank_arguments(args),
    ]
    started = time.monotonic()
    print(f"node {index} of {args.nodes}: {' '.join(command[3:9])}", flush=True)
    returncode = subprocess.run(command, env=env, check=False).returncode
    checks.append(
        check(
            "all-reduce processes",
            returncode == 0,
            f"torchrun exited {returncode} after {time.monotonic() - started:.1f} s",
        )
    )
    ok = all(c["ok"] for c in checks)
    print(REPORT_PREFIX + json.dumps({"node": facts, "checks": checks, "ok": ok}), flush=True)
    return 0 if ok else 1


def _rank_arguments(args: argparse.Namespace) -> list[str]:
    forwarded = [
        f"--backend={args.backend}",
        f"--device={args.device}",
        f"--bytes={args.bytes}",
        f"--iterations={args.iterations}",
        f"--warmup={args.warmup}",
        f"--min-bus-bandwidth-gbps={args.min_bus_bandwidth_gbps}",
        f"--rendezvous-seconds={args.rendezvous_seconds}",
        f"--log-dir={args.log_dir}",
    ]
    return [*forwarded, "--require-efa"] if args.require_efa else forwarded


# --- one process of the world: the all-reduce ----------------------------------------------------------


def bus_bandwidth_gbps(size_bytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce, in Gbit/s: the algorithm bandwidth (bytes / time)
    times 2(n-1)/n, what each rank's links carried; 0 for a world of one (nothing crossed)."""
    if world_size < 2 or seconds <= 0:
        return 0.0
    return size_bytes / seconds * 2 * (world_size - 1) / world_size * 8 / 1e9


def bandwidth_check(measured_gbps: float, minimum_gbps: float, world_size: int) -> dict[str, Any]:
    detail = f"{measured_gbps:.2f} Gbit/s ({measured_gbps / 8:.2f} GB/s) over {world_size} processes"
    if world_size < 2:
        return check(
            "all-reduce bus bandwidth", minimum_gbps <= 0, detail + ": a world of one crosses nothing"
        )
    ok = measured_gbps >= minimum_gbps
    return check("all-reduce bus bandwidth", ok, f"{detail}, minimum {minimum_gbps:g} Gbit/s")


def nccl_network(log_dir: Path) -> dict[str, Any]:
    """What this process's NCCL log (NCCL_DEBUG_FILE, by host and pid) says it loaded and chose."""
    lines: list[str] = []
    for path in sorted(log_dir.glob(NCCL_LOG_NAME.replace("%h", "*").replace("%p", str(os.getpid())))):
        for line in path.read_text(errors="replace").splitlines():
            if any(p.search(line) for p in NCCL_LINE_PATTERNS) and line not in lines:
                lines.append(line.strip())
    networks = sorted({m.group(1) for line in lines if (m := NETWORK_PATTERN.search(line))})
    return {"networks": networks, "lines": lines[:20]}


def run_rank(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.rendezvous_seconds))

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    elements = max(1, args.bytes // 4)
    buffer = torch.full((elements,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(buffer)
    synchronize()
    expected = world * (world + 1) / 2
    correct = bool(torch.all(buffer == expected).item())
    for _ in range(args.warmup):
        dist.all_reduce(buffer)
    synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.iterations):
        dist.all_reduce(buffer)
    synchronize()
    elapsed = torch.tensor(
        [(time.perf_counter() - start) / args.iterations], dtype=torch.float64, device=device
    )
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time, as a collective ends
    seconds = float(elapsed.item())

    checks: list[dict[str, Any]] = []
    report: dict[str, Any] = {"rank": rank, "local_rank": local_rank, "world_size": world}
    if local_rank == 0:
        if args.backend == "nccl":
            network = nccl_network(Path(args.log_dir))
            report["nccl"] = network
            if args.require_efa:
                ok = network["networks"] == [EFA_NETWORK]
                detail = f"NCCL used {network['networks'] or 'no network it logged'}"
                checks.append(check("NCCL network", ok, detail + f" (needs '{EFA_NETWORK}', aws-ofi-nccl)"))
            else:
                checks.append(
                    check("NCCL network", True, f"NCCL used {network['networks']} (no EFA asked for)")
                )
        elif args.require_efa:
            checks.append(check("NCCL network", False, f"backend {args.backend}: NCCL and EFA not used"))
    if rank == 0:
        gbps = bus_bandwidth_gbps(args.bytes, seconds, world)
        report["all_reduce"] = {
            "backend": args.backend,
            "bytes": elements * 4,
            "iterations": args.iterations,
            "seconds_per_operation": seconds,
            "bus_bandwidth_gbps": round(gbps, 3),
            "bus_bandwidth_gbytes_per_second": round(gbps / 8, 3),
            "correct": correct,
        }
        checks.append(check("all-reduce result", correct, f"every element {expected:g} after one sum"))
        checks.append(bandwidth_check(gbps, args.min_bus_bandwidth_gbps, world))
    dist.destroy_process_group()
    ok = all(c["ok"] for c in checks)
    if checks:
        print(REPORT_PREFIX + json.dumps({**report, "checks": checks, "ok": ok}), flush=True)
    return 0 if ok else 1


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    modes = top.add_subparsers(dest="mode", required=True)
    for mode in ("node", "rank"):
        sub = modes.add_parser(mode)
        sub.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
        sub.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
        sub.add_argument("--bytes", type=int, default=1 << 30, help="the all-reduce's buffer (default 1 GiB)")
        sub.add_argument("--iterations", type=int, default=20)
        sub.add_argument("--warmup", type=int, default=5)
        sub.add_argument("--min-bus-bandwidth-gbps", type=float, default=0.0)
        sub.add_argument("--rendezvous-seconds", type=int, default=1800)
        sub.add_argument("--log-dir", default="/tmp/preflight")
        sub.add_argument("--require-efa", action="store_true")
        if mode == "node":
            sub.add_argument("--nodes", type=int, required=True)
            sub.add_argument("--processes-per-node", type=int, required=True)
            sub.add_argument("--leader-address", required=True)
            sub.add_argument("--port", type=int, default=29500)
            sub.add_argument("--efa-devices", type=int, default=0)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_node(args) if args.mode == "node" else run_rank(args)


if __name__ == "__main__":
    sys.exit(main())
