"""Preloader benchmark: model-cache vs `aws s3 cp --recursive` vs a boto3 download_file loop.

One run, one local S3 server (moto), one data set shaped like a checkpoint, one destination disk.
Also measured, as ceilings: the disk's sequential write+fsync speed, and the server's raw parallel
ranged-GET speed (bytes read and thrown away). Writes results.json and RESULTS.md next to itself.

See README.md for the venvs; the exact command used is recorded in RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024
GIB = 1024 * MIB
MB = 1_000_000
BUCKET = "bench-models"
PREFIX = "models/bench-llama"
REVISION = "rev1"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(ranged: bool, tmpdir: Path) -> tuple[subprocess.Popen, str]:
    """moto in its own process; its objects spill to temp files under `tmpdir` (cleaned after)."""
    port = free_port()
    if ranged:
        command = [sys.executable, str(HERE / "moto_ranged_server.py"), "--port", str(port)]
    else:
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            return process, endpoint
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("moto server did not start")


def client(endpoint: str, max_pool: int = 10):  # type: ignore[no-untyped-def]
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(max_pool_connections=max_pool),
    )


class RandomStream(io.RawIOBase):
    """`size` bytes of os.urandom, produced as read: a shard is never whole in this process."""

    def __init__(self, size: int) -> None:
        self.remaining = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        count = min(len(buffer), self.remaining)
        buffer[:count] = os.urandom(count)
        self.remaining -= count
        return count


def checkpoint_layout(total_bytes: int, shard_bytes: int) -> dict[str, int]:
    """Shards like model-0000N-of-0000M.safetensors plus the json files a HF checkpoint carries."""
    shards = max(1, round(total_bytes / shard_bytes))
    sizes = {
        f"model-{i:05d}-of-{shards:05d}.safetensors": total_bytes // shards for i in range(1, shards + 1)
    }
    sizes.update(
        {
            "config.json": 700,
            "generation_config.json": 180,
            "model.safetensors.index.json": 24_000,
            "special_tokens_map.json": 300,
            "tokenizer.json": 9 * MIB,
            "tokenizer_config.json": 50_000,
        }
    )
    return sizes


def upload(endpoint: str, layout: dict[str, int]) -> None:
    s3 = client(endpoint)
    s3.create_bucket(Bucket=BUCKET)
    # 8 MiB parts like awscli's default, so shards carry real multipart 'md5-N' ETags.
    config = TransferConfig(multipart_threshold=8 * MIB, multipart_chunksize=8 * MIB, max_concurrency=4)
    for name, size in layout.items():
        s3.upload_fileobj(
            io.BufferedReader(RandomStream(size), 8 * MIB),
            BUCKET,
            f"{PREFIX}/{REVISION}/{name}",
            Config=config,
        )


def disk_write_ceiling(directory: Path, total: int) -> dict:
    """dd-like: sequential 8 MiB writes of the data set's size, then fsync. No network, no hashing."""
    block = os.urandom(8 * MIB)
    path = directory / "dd-test.bin"
    started = time.monotonic()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        while written < total:
            written += os.write(descriptor, block[: min(len(block), total - written)])
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    seconds = time.monotonic() - started
    path.unlink()
    return {"name": "disk sequential write + fsync (dd-like)", "bytes": total, "seconds": round(seconds, 2)}


def raw_get_ceiling(endpoint: str, layout: dict[str, int], part_bytes: int, concurrency: int) -> dict:
    """What the server can deliver: parallel ranged GETs, bytes read and dropped (no disk)."""
    s3 = client(endpoint, concurrency + 4)
    ranges = [
        (f"{PREFIX}/{REVISION}/{name}", start, min(start + part_bytes, size) - 1)
        for name, size in layout.items()
        for start in range(0, size, part_bytes)
    ]

    def fetch(item: tuple[str, int, int]) -> int:
        key, first, last = item
        body = s3.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={first}-{last}")["Body"]
        return sum(len(chunk) for chunk in body.iter_chunks(MIB))

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(fetch, ranges))
    seconds = time.monotonic() - started
    return {
        "name": f"server ceiling: raw ranged GETs, {concurrency} threads, {part_bytes // MIB} MiB, no disk",
        "bytes": total,
        "seconds": round(seconds, 2),
    }


BOTO3_LOOP = """
import sys, boto3
from boto3.s3.transfer import TransferConfig
endpoint, bucket, prefix, dest, concurrency, chunk = sys.argv[1:7]
s3 = boto3.client("s3", endpoint_url=endpoint)
config = TransferConfig() if concurrency == "default" else TransferConfig(
    max_concurrency=int(concurrency), multipart_chunksize=int(chunk), multipart_threshold=int(chunk))
import os
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
    for item in page.get("Contents", []):
        target = os.path.join(dest, item["Key"][len(prefix) + 1:])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        s3.download_file(bucket, item["Key"], target, Config=config)
"""


def run_timed(name: str, command: list[str], env: dict[str, str], dest: Path, layout: dict[str, int]) -> dict:
    """Wall time of the tool, then of the `sync` that makes its writes durable (ours fsyncs itself),
    and the CPU seconds the tool's process used (wait4 rusage: independent of other load)."""
    dest.mkdir(parents=True)
    subprocess.run(["sync"], check=True)
    log_path = dest.parent / "tool-stderr.txt"
    with log_path.open("w") as log_file:
        started = time.monotonic()
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log_file)
        _pid, status, usage = os.wait4(process.pid, 0)
        tool_seconds = time.monotonic() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    subprocess.run(["sync"], check=True)
    durable_seconds = time.monotonic() - started
    stderr = log_path.read_text()
    log_path.unlink()
    if process.returncode != 0:
        raise RuntimeError(f"{name} failed ({process.returncode}): {stderr[-3000:]}")
    found = {p.relative_to(dest).as_posix(): p.stat().st_size for p in dest.rglob("*") if p.is_file()}
    data_files = {
        path: size for path, size in found.items() if not path.endswith(".model-cache-complete.json")
    }
    # Ours nests <model>/<revision>/; the others write the prefix's content directly.
    data_files = {path.split(f"bench-llama/{REVISION}/")[-1]: size for path, size in data_files.items()}
    if data_files != layout:
        raise RuntimeError(f"{name} produced a different tree: {sorted(set(data_files) ^ set(layout))}")
    shutil.rmtree(dest)
    return {
        "name": name,
        "bytes": sum(layout.values()),
        "seconds": round(tool_seconds, 2),
        "seconds_until_durable": round(durable_seconds, 2),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def summarize(entries: list[dict]) -> dict:
    """Best (fastest) round, plus the median and every round's numbers."""
    for entry in entries:
        entry["mb_per_s"] = round(entry["bytes"] / MB / entry["seconds"], 1)
        if "seconds_until_durable" in entry:
            entry["durable_mb_per_s"] = round(entry["bytes"] / MB / entry["seconds_until_durable"], 1)
    key = "durable_mb_per_s" if "durable_mb_per_s" in entries[0] else "mb_per_s"
    ordered = sorted(entries, key=lambda entry: entry[key])
    best = dict(ordered[-1])
    best["median_" + key] = ordered[len(ordered) // 2][key]
    best["rounds"] = [{k: v for k, v in entry.items() if k not in ("name", "bytes")} for entry in entries]
    if "cpu_seconds" in best:
        best["median_cpu_seconds"] = sorted(entry["cpu_seconds"] for entry in entries)[len(entries) // 2]
    return best


def stock_moto_probe(probe_bytes: int, part_bytes: int, tmpdir: Path) -> dict:
    """Stock moto: one object, full GET vs sequential ranged GETs of `part_bytes`."""
    process, endpoint = start_server(ranged=False, tmpdir=tmpdir)
    try:
        s3 = client(endpoint)
        s3.create_bucket(Bucket=BUCKET)
        s3.upload_fileobj(io.BufferedReader(RandomStream(probe_bytes), 8 * MIB), BUCKET, "probe")
        started = time.monotonic()
        s3.get_object(Bucket=BUCKET, Key="probe")["Body"].read()
        full = time.monotonic() - started
        started = time.monotonic()
        for first in range(0, probe_bytes, part_bytes):
            last = min(first + part_bytes, probe_bytes) - 1
            s3.get_object(Bucket=BUCKET, Key="probe", Range=f"bytes={first}-{last}")["Body"].read()
        ranged = time.monotonic() - started
    finally:
        process.terminate()
        process.wait()
    return {
        "object_bytes": probe_bytes,
        "part_bytes": part_bytes,
        "full_get_mb_per_s": round(probe_bytes / MB / full, 1),
        "sequential_ranged_get_mb_per_s": round(probe_bytes / MB / ranged, 1),
    }


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-gib", type=float, default=3.0, help="size of the shards together")
    parser.add_argument("--shard-gib", type=float, default=1.0, help="size of each safetensors shard")
    parser.add_argument("--part-size-mib", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "model-cache-bench")
    parser.add_argument("--aws", default=str(HERE / ".venv-awscli" / "bin" / "aws"), help="awscli executable")
    parser.add_argument("--model-cache", default=shutil.which("model-cache") or "model-cache")
    parser.add_argument(
        "--stock-probe-mib", type=int, default=512, help="object size for the stock-moto probe"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; best and median reported")
    args = parser.parse_args()

    total, shard = int(args.total_gib * GIB), int(args.shard_gib * GIB)
    part, concurrency = args.part_size_mib * MIB, args.concurrency
    layout = checkpoint_layout(total, shard)
    dataset = sum(layout.values())
    args.workdir.mkdir(parents=True, exist_ok=True)
    needed = dataset * 2 + 2 * GIB  # server copy + one destination at a time + slack
    if shutil.disk_usage(args.workdir).free < needed:
        raise SystemExit(f"need {needed / GIB:.1f} GiB free under {args.workdir}")
    aws_version = subprocess.run([args.aws, "--version"], capture_output=True, text=True).stdout.strip()
    load_before = os.getloadavg()

    server_tmp = args.workdir / "moto-objects"
    server_tmp.mkdir(exist_ok=True)
    process, endpoint = start_server(ranged=True, tmpdir=server_tmp)
    try:
        print(f"uploading {dataset / GIB:.2f} GiB to {endpoint}", file=sys.stderr, flush=True)
        upload(endpoint, layout)
        env = {
            **os.environ,
            **CREDENTIALS,
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        env.pop("AWS_PROFILE", None)
        tuned_config = args.workdir / "awscli-tuned.cfg"
        tuned_config.write_text(
            f"[default]\ns3 =\n  max_concurrent_requests = {concurrency}\n"
            f"  multipart_chunksize = {args.part_size_mib}MB\n"
            f"  multipart_threshold = {args.part_size_mib}MB\n"
        )
        source = f"s3://{BUCKET}/{PREFIX}/{REVISION}"
        dest = args.workdir / "dest"
        ours = [
            *[
                args.model_cache,
                "preload",
                "--model-name",
                "bench-llama",
                "--source",
                f"s3://{BUCKET}/{PREFIX}",
            ],
            *["--revision", REVISION, "--shared-root", str(dest), "--endpoint-url", endpoint],
            *["--part-size-mib", str(args.part_size_mib), "--concurrency", str(concurrency)],
            *["--progress-interval-seconds", "60"],
        ]
        aws_cp = [args.aws, "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url", endpoint]
        boto3_loop = [sys.executable, "-c", BOTO3_LOOP, endpoint, BUCKET, f"{PREFIX}/{REVISION}", str(dest)]
        methods = [
            ("model-cache preload (ours: sha256 + ETag MD5 check, fsync per chunk, marker)", ours, env),
            ("model-cache preload --skip-etag-check (ours, sha256 only)", [*ours, "--skip-etag-check"], env),
            ("aws s3 cp --recursive (defaults: 10 requests, 8 MB parts)", [*aws_cp, source, str(dest)], env),
            (
                f"aws s3 cp --recursive (tuned: {concurrency} requests, {args.part_size_mib} MB parts)",
                [*aws_cp, source, str(dest)],
                {**env, "AWS_CONFIG_FILE": str(tuned_config)},
            ),
            (
                "boto3 download_file loop (default TransferConfig: 10 threads, 8 MB parts)",
                [*boto3_loop, "default", "0"],
                env,
            ),
            (
                f"boto3 download_file loop (tuned: {concurrency} threads, {args.part_size_mib} MiB parts)",
                [*boto3_loop, str(concurrency), str(part)],
                env,
            ),
        ]
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in methods}
        ceiling_runs: list[list[dict]] = [[], []]
        commands = {name: " ".join(command) for name, command, _ in methods}
        # Interleaved rounds: on a shared machine load comes and goes; each method sees the same mix.
        # The dd test evicts the server's objects from the page cache; the raw GET pass right after
        # it reads them all back, so no method starts cold. The order rotates every round so no
        # method always runs first (after the warm-up) or last.
        for round_index in range(args.rounds):
            ceiling_runs[0].append(disk_write_ceiling(args.workdir, dataset))
            ceiling_runs[1].append(raw_get_ceiling(endpoint, layout, part, concurrency))
            shift = round_index % len(methods)
            for name, command, method_env in methods[shift:] + methods[:shift]:
                print(f"round {round_index + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
                runs[name].append(run_timed(name, command, method_env, dest, layout))
        ceilings = [summarize(entries) for entries in ceiling_runs]
        results = [summarize(entries) | {"command": commands[name]} for name, entries in runs.items()]
    finally:
        process.terminate()
        process.wait()
        shutil.rmtree(server_tmp, ignore_errors=True)
    stock = stock_moto_probe(min(args.stock_probe_mib * MIB, shard), part, server_tmp.parent)
    shutil.rmtree(args.workdir, ignore_errors=True)

    disk = ceilings[0]["mb_per_s"]
    server = ceilings[1]["mb_per_s"]
    ours = results[0]
    others = [entry for entry in results if not entry["name"].startswith("model-cache")]
    best_other = max(others, key=lambda entry: entry["durable_mb_per_s"])
    for entry in results:
        entry["durable_vs_disk_ceiling"] = round(entry["durable_mb_per_s"] / disk, 2)
        entry["durable_vs_server_ceiling"] = round(entry["durable_mb_per_s"] / server, 2)
        entry["durable_vs_ours"] = round(entry["durable_mb_per_s"] / ours["durable_mb_per_s"], 2)

    report = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "nproc": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "versions": {
            "model-cache": version("vllm-platform-model-cache"),
            "boto3": version("boto3"),
            "botocore": version("botocore"),
            "moto": version("moto"),
            "awscli": aws_version,
        },
        "dataset": {"bytes": dataset, "files": layout},
        "settings": {"part_size_mib": args.part_size_mib, "concurrency": concurrency, "rounds": args.rounds},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "ceilings": ceilings,
        "results": results,
        "stock_moto_probe": stock,
        "ours_vs_best_other_durable": round(ours["durable_mb_per_s"] / best_other["durable_mb_per_s"], 2),
        "best_other": best_other["name"],
    }
    (HERE / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report)
    print(json.dumps({"ours_vs_best_other_durable": report["ours_vs_best_other_durable"]}))


def _row(cells: list[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def write_markdown(report: dict) -> None:
    machine, dataset, stock = report["machine"], report["dataset"], report["stock_moto_probe"]
    files = ", ".join(f"{name} {size / MIB:.1f} MiB" for name, size in dataset["files"].items())
    lines = [
        "# Preloader benchmark results",
        "",
        f"- date: {report['date']}",
        f"- machine: {machine['nproc']} cores (`nproc`), {machine['memory_gib']} GiB RAM, kernel "
        f"{machine['kernel']}, Python {machine['python']}",
        f"- load average before/after: {machine['load_average_before']} / {machine['load_average_after']} "
        "(a shared machine: other sessions' jobs were running)",
        f"- versions: {', '.join(f'{name} {value}' for name, value in report['versions'].items())}",
        f"- data: {dataset['bytes'] / GIB:.2f} GiB in {len(dataset['files'])} files ({files})",
        f"- re-run: `{report['command']}`",
        "",
        "MB/s = 10^6 bytes per second of wall time. *Durable* adds the `sync` after the tool exits: our",
        "preloader fsyncs as it goes, the others leave dirty pages, so durable is the fair comparison.",
        f"Best of {report['settings']['rounds']} interleaved rounds (median alongside); CPU s = user+sys",
        "of the tool's process (wait4), which other load does not inflate much. Ratios use best rounds.",
        "",
        _row(["method", "s", "s until durable", "durable MB/s (best)", "median", "CPU s (median)"])
        + " vs disk ceiling | vs server ceiling | vs ours |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for entry in report["results"]:
        lines.append(
            _row(
                [
                    entry["name"],
                    entry["seconds"],
                    entry["seconds_until_durable"],
                    entry["durable_mb_per_s"],
                    entry["median_durable_mb_per_s"],
                    entry["median_cpu_seconds"],
                    entry["durable_vs_disk_ceiling"],
                    entry["durable_vs_server_ceiling"],
                    entry["durable_vs_ours"],
                ]
            )
        )
    lines += ["", "| ceiling | s (best) | MB/s (best) | median MB/s |", "| --- | ---: | ---: | ---: |"]
    for entry in report["ceilings"]:
        lines.append(_row([entry["name"], entry["seconds"], entry["mb_per_s"], entry["median_mb_per_s"]]))
    lines += [
        "",
        f"Ours vs the best other tool ({report['best_other']}), durable: "
        f"**{report['ours_vs_best_other_durable']}x**.",
        "",
        "Stock moto probe (why the server runs with `moto_ranged_server.py`): one "
        f"{stock['object_bytes'] / MIB:.0f} MiB object, full GET {stock['full_get_mb_per_s']} MB/s, "
        f"sequential {stock['part_bytes'] // MIB} MiB ranged GETs {stock['sequential_ranged_get_mb_per_s']} "
        "MB/s: stock moto reads the whole object for every range, so ranged downloaders would measure that.",
        "",
    ]
    (HERE / "RESULTS.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
