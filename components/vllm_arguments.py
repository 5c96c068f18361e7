"""The `vllm serve` command line of one model, built from its typed settings (pure, no Pulumi).

One function, `build_server_arguments`, is shared by the Deployment, the validate-time check and the
e2e harness (which starts the real pinned vLLM with exactly these arguments), so what is checked is
what runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from components import server_auth
from domain.capacity.time_to_serve import CPU_GROUP_DEFAULT_TIMEOUT_SECONDS
from domain.config.errors import Problem
from domain.config.lora import LoraAdapterConfig
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig

SERVE_COMMAND: tuple[str, ...] = ("vllm", "serve")
"""The container command; `build_server_arguments` returns what follows it."""

LISTEN_HOST = "0.0.0.0"
"""All interfaces: the Service, the load balancer (target type ip) and Prometheus reach the pod IP."""

DISTRIBUTED_EXECUTOR_BACKEND = "mp"
"""With gpus_per_replica > 1: one vLLM worker process per GPU inside the pod, never Ray. 0.32.0
already picks `mp` on one node unless a Ray placement group exists (config/parallel.py,
ParallelConfig.__post_init__); the flag pins it, since the image ships Ray."""


def format_number(value: float) -> str:
    """`0.9`, not `0.9000000000000001` or `0.90`: the spelling a reviewer expects in a diff."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _switch(flag: str, enabled: bool) -> str:
    """vLLM 0.32.0 declares these as BooleanOptionalAction: `--x` / `--no-x` (infra/data snapshot)."""
    return flag if enabled else "--no-" + flag.removeprefix("--")


ROUTER_POLICIES_THAT_RENDER = frozenset({"cache_aware"})
"""vllm-router 0.1.17's prefix-aware policy tokenizes each request through the replicas'
`/v1/completions/render` and `/v1/chat/completions/render` (forwarding the client's key) and keys
its prefix tree on the token ids. vLLM 0.32.0 answers those routes 403 unless it runs with
`--enable-scale-out`, and the router then silently routes without any prefix match (measured in
tests/e2e/test_router.py: every repeated prefix went to the first replica)."""


def serves_render_endpoints(config: PlatformConfig, model: ModelConfig) -> bool:
    """Whether `model`'s servers need vLLM's render endpoints: the router routes it by prefix."""
    return config.routing_policy(model) in ROUTER_POLICIES_THAT_RENDER


LORA_ADAPTERS_DIR = ".lora-adapters"
"""model-cache's layout (model_cache.layout.adapter_dir): an adapter revision lives at
`<root>/.lora-adapters/<model>/<adapter>/<revision>/`, beside `<root>/<model>/<revision>/`."""

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""vLLM's switch (envs.py, 0.32.0) for `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`."""


def adapter_path(root: str, model: ModelConfig, adapter: LoraAdapterConfig) -> str:
    """Where the preloader puts `adapter` under `root` (the shared or node-local model root)."""
    return f"{root}/{LORA_ADAPTERS_DIR}/{model.name}/{adapter.name}/{adapter.source.revision}"


def lora_arguments(model: ModelConfig, adapter_root: str | None) -> list[str]:
    """vLLM's LoRA flags for `model` (none without `lora`); adapters are read from `adapter_root`."""
    lora = model.lora
    if lora is None:
        return []
    arguments = [
        "--enable-lora",
        "--max-loras",
        str(lora.max_loras),
        "--max-lora-rank",
        str(lora.max_lora_rank),
        "--max-cpu-loras",
        str(lora.cpu_cache_size),
    ]
    if lora.adapters:
        if adapter_root is None:
            raise ValueError(f"model {model.name} serves LoRA adapters: pass the root they live under")
        # `name=path`: vLLM lists each under /v1/models with the first served name as its parent.
        modules = [f"{a.name}={adapter_path(adapter_root, model, a)}" for a in lora.adapters]
        arguments += ["--lora-modules", *modules]
    return arguments


def lora_environment(model: ModelConfig) -> list[dict[str, str]]:
    """`VLLM_ALLOW_RUNTIME_LORA_UPDATING` only where `lora.runtime_loading` asks for it (docs/lora.md)."""
    if model.lora is None or not model.lora.runtime_loading:
        return []
    return [{"name": RUNTIME_LORA_ENV, "value": "True"}]


LEADER_WORKER_SET_NAME = "vllm"
"""components/model_service.py's SERVER_NAME: the LeaderWorkerSet, whose leader pods `vllm-<group>`
name the per-group headless Services that make up `LWS_LEADER_ADDRESS`."""

MASTER_PORT = 29501
"""`--master-port` of a multi-node replica: the leader's torch.distributed store (vLLM 0.32.0's default,
written out so the NetworkPolicy and a reader see it)."""


@dataclass(frozen=True)
class NodeRole:
    """Which member of a multi-node replica (a LeaderWorkerSet group) the arguments are for.

    `rank` and `leader_address` are command-line text: in the rendered pods `$(LWS_WORKER_INDEX)` and
    `$(LWS_LEADER_ADDRESS)`, which the kubelet expands from the variables LWS's pod webhook injects
    (0 for the leader); the validate-time parser check gives the values they expand to.
    """

    rank: str
    leader_address: str
    leader: bool
    join_timeout_seconds: int | None = None
    """`--distributed-timeout-seconds` (ModelPlan.group_join_timeout_seconds): how long members wait for
    each other; None leaves vLLM's (PyTorch's) default."""

    @classmethod
    def in_pod(cls, *, leader: bool) -> NodeRole:
        return cls(rank="$(LWS_WORKER_INDEX)", leader_address="$(LWS_LEADER_ADDRESS)", leader=leader)


def multi_node_arguments(model: ModelConfig, role: NodeRole) -> list[str]:
    """vLLM's own multi-node launch for `model` (issue 42): the world of tensor × pipeline (× data)
    ranks over `--nnodes` nodes, rendezvous at the leader (`--master-addr`), every node but the leader
    headless (no API server: only its workers, vllm/entrypoints/cli/serve.py run_headless).

    With data parallelism vLLM 0.32.0 needs nothing per node beyond `--node-rank`: it infers the
    node's local ranks and its first rank from it, and takes the leader's address as the data-parallel
    address (engine/arg_utils.py, create_engine_config), so no start rank is computed here."""
    data = ["--data-parallel-size", str(model.data_parallel_size)] if model.data_parallel_size > 1 else []
    arguments = [
        "--pipeline-parallel-size",
        str(model.pipeline_parallel_size),
        *data,
        "--nnodes",
        str(model.nodes_per_replica),
        "--node-rank",
        role.rank,
        "--master-addr",
        role.leader_address,
        "--master-port",
        str(MASTER_PORT),
    ]
    if role.join_timeout_seconds is not None:
        # Both the NCCL groups' and the gloo (CPU) groups' timeouts: PyTorch's defaults (600 s and
        # 1800 s) tore a group down while a member on a new node was still starting (issue 50).
        arguments += [
            "--distributed-timeout-seconds",
            str(role.join_timeout_seconds),
            "--cpu-distributed-timeout-seconds",
            str(max(role.join_timeout_seconds, CPU_GROUP_DEFAULT_TIMEOUT_SECONDS)),
        ]
    if model.parallelism.expert_parallel:
        arguments.append("--enable-expert-parallel")
    if not role.leader:
        arguments.append("--headless")
    return arguments


def build_server_arguments(
    model: ModelConfig,
    model_path: str,
    *,
    render_endpoints: bool = False,
    adapter_root: str | None = None,
    tenants: bool = False,
    node_role: NodeRole | None = None,
) -> list[str]:
    """Arguments after `vllm serve` for `model`, serving the weights at `model_path` and its LoRA
    adapters from under `adapter_root` (`adapter_path`); with `render_endpoints`, also vLLM's render
    routes (`serves_render_endpoints`); with `tenants`, the stack has tenants (components/server_auth.py).

    The model path is the positional argument: vLLM 0.32.0 still parses `--model` but warns that
    `vllm serve` takes the model positionally and that `--model` "will be removed in a future
    version" (vllm/utils/argparse_utils.py, FlexibleArgumentParser.parse_args).

    The API key is not an argument: vLLM reads `VLLM_API_KEY` from the environment, which the
    Deployment fills from a Secret, so the key never appears in the pod spec or `ps` output.
    """
    if model.is_multi_node and node_role is None:
        raise ValueError(f"model {model.name} spans {model.nodes_per_replica} nodes: pass its node_role")
    engine = model.vllm
    arguments = [
        model_path,
        "--served-model-name",
        model.openai_model_name,
        "--host",
        LISTEN_HOST,
        "--port",
        str(engine.port),
        "--tensor-parallel-size",
        str(model.tensor_parallel_size),
        *(
            ["--distributed-executor-backend", DISTRIBUTED_EXECUTOR_BACKEND]
            if model.tensor_parallel_size > 1 or model.is_multi_node
            else []
        ),
        *(multi_node_arguments(model, node_role) if model.is_multi_node and node_role else []),
        "--gpu-memory-utilization",
        format_number(engine.gpu_memory_utilization),
        "--max-model-len",
        str(engine.max_model_len),
        "--max-num-seqs",
        str(engine.max_num_seqs),
        "--dtype",
        engine.dtype,
        "--kv-cache-dtype",
        engine.kv_cache_dtype,
        _switch("--enable-prefix-caching", engine.enable_prefix_caching),
    ]
    if engine.max_num_batched_tokens is not None:
        arguments += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    if engine.quantization is not None:
        arguments += ["--quantization", engine.quantization]
    if engine.enable_chunked_prefill is not None:
        arguments.append(_switch("--enable-chunked-prefill", engine.enable_chunked_prefill))
    if engine.enforce_eager:
        arguments.append("--enforce-eager")
    arguments += lora_arguments(model, adapter_root)
    # Drain: in-flight (streaming) requests get this long after SIGTERM; see components/probes.py.
    arguments += ["--shutdown-timeout", str(model.drain.shutdown_timeout_seconds)]
    if render_endpoints:
        # Also registers /v1/*/derender, /inference/v1/generate and /inference/v1/abort_requests;
        # like every route they need the model's key (components/pod_files/vllm_platform_auth.py).
        arguments.append("--enable-scale-out")
    # Every route but /health and /metrics needs the key (components/server_auth.py).
    arguments += server_auth.server_arguments(tenants=tenants)
    return arguments + list(engine.extra_args)


FLASHINFER_ALLREDUCE_BACKEND_ENV = "VLLM_FLASHINFER_ALLREDUCE_BACKEND"
"""vLLM's variable (envs.py in 0.26.0 and 0.32.0: auto, trtllm or mnnvl) for the FlashInfer all-reduce
workspace that the fused all-reduce + RMSNorm pass (and, in 0.32.0, plain all-reduces) use."""


def tensor_parallel_environment(model: ModelConfig) -> list[dict[str, str]]:
    """The NCCL settings (`vllm.nccl_env`) and the FlashInfer all-reduce backend
    (`vllm.flashinfer_allreduce_backend`) as container env entries, sorted by name; none with one GPU.

    A single-GPU pod does no collective communication, so the variables would only be noise in its
    spec and a changed default would roll every single-GPU pod for nothing (docs/tensor-parallel.md).
    """
    if model.tensor_parallel_size == 1 and not model.is_multi_node:
        return []
    settings = {
        **model.vllm.nccl_env,
        FLASHINFER_ALLREDUCE_BACKEND_ENV: model.vllm.flashinfer_allreduce_backend,
    }
    return [{"name": name, "value": value} for name, value in sorted(settings.items())]


@dataclass(frozen=True)
class ReservedFlag:
    spellings: tuple[str, ...]
    fix: str


# Flags the typed settings (or the platform) own. A copy in `vllm.extra_args` would either be
# silently overridden or silently win (argparse keeps the last value), so it is rejected.
RESERVED_FLAGS: tuple[ReservedFlag, ...] = (
    ReservedFlag(("--model",), "the model path is set by the platform from source (the preloaded copy)"),
    ReservedFlag(("--served-model-name",), "set served_model_name instead"),
    ReservedFlag(("--host",), "the server listens on 0.0.0.0 so the Service and load balancer reach it"),
    ReservedFlag(("--port",), "set vllm.port instead"),
    ReservedFlag(("--tensor-parallel-size", "-tp"), "set gpus_per_replica instead (the GPUs of one pod)"),
    ReservedFlag(("--gpu-memory-utilization",), "set vllm.gpu_memory_utilization instead"),
    ReservedFlag(("--max-model-len",), "set vllm.max_model_len instead"),
    ReservedFlag(("--max-num-seqs",), "set vllm.max_num_seqs instead"),
    ReservedFlag(("--max-num-batched-tokens",), "set vllm.max_num_batched_tokens instead"),
    ReservedFlag(("--dtype",), "set vllm.dtype instead"),
    ReservedFlag(("--kv-cache-dtype",), "set vllm.kv_cache_dtype instead"),
    ReservedFlag(("--quantization", "-q"), "set vllm.quantization instead"),
    ReservedFlag(
        ("--enable-prefix-caching", "--no-enable-prefix-caching"), "set vllm.enable_prefix_caching instead"
    ),
    ReservedFlag(
        ("--enable-chunked-prefill", "--no-enable-chunked-prefill"), "set vllm.enable_chunked_prefill instead"
    ),
    ReservedFlag(("--enforce-eager", "--no-enforce-eager"), "set vllm.enforce_eager instead"),
    ReservedFlag(
        ("--enable-scale-out", "--no-enable-scale-out"),
        "the platform turns it on for models the router routes by prefix (router policy "
        "cache_aware), which need vLLM's render endpoints; choose the policy instead",
    ),
    ReservedFlag(
        (
            "--enable-lora",
            "--no-enable-lora",
            "--lora-modules",
            "--max-loras",
            "--max-lora-rank",
            "--max-cpu-loras",
        ),
        "set the model's lora block instead (adapters, max_loras, max_lora_rank, max_cpu_loras; "
        "docs/lora.md): the preloader fetches the adapters and the capacity plan counts them",
    ),
    ReservedFlag(
        ("--shutdown-timeout",), "set drain.shutdown_timeout_seconds instead (it also sizes the grace period)"
    ),
    ReservedFlag(
        ("--api-key",),
        "the API key comes from the secret store (api_key_secret) through VLLM_API_KEY; "
        "a key on the command line is visible in the pod spec",
    ),
    ReservedFlag(
        ("--middleware",),
        "the platform's API-key middleware must stay the outermost one (added last): a "
        "middleware after it would see requests before the key is checked",
    ),
    ReservedFlag(
        (
            "--pipeline-parallel-size",
            "-pp",
            "--data-parallel-size",
            "-dp",
            "--enable-expert-parallel",
            "--no-enable-expert-parallel",
            "-ep",
        ),
        "set the model's parallelism block instead (nodes_per_replica, pipeline_parallel_size, "
        "data_parallel_size, expert_parallel; docs/multi-node.md); otherwise scale out with "
        "replicas",
    ),
    ReservedFlag(
        ("--distributed-executor-backend",),
        "the platform runs vLLM's multiprocessing workers (`mp`) in each pod, and across the "
        "nodes of a replica with parallelism.nodes_per_replica (never Ray)",
    ),
)
_RESERVED = {spelling: flag for flag in RESERVED_FLAGS for spelling in flag.spellings}
_NEGATIVE_NUMBER = re.compile(r"^-\d")


def flag_name(token: str) -> str | None:
    """The flag a command-line token names, spelled as vLLM's parser matches it, or None for a value.

    vLLM's FlexibleArgumentParser treats `--max_model_len` as `--max-model-len`, and `--x=v` as `--x v`.
    """
    if not token.startswith("-") or _NEGATIVE_NUMBER.match(token):
        return None
    name = token.split("=", 1)[0]
    return name.replace("_", "-") if name.startswith("--") else name


def reserved_flag_problems(extra_args: Sequence[str], at: tuple[str | int, ...]) -> list[Problem]:
    problems = []
    for index, token in enumerate(extra_args):
        name = flag_name(token)
        reserved = _RESERVED.get(name) if name else None
        if reserved is not None:
            problems.append(
                Problem(
                    path=(*at, index),
                    value=token,
                    message=f"'{name}' duplicates a setting the platform builds: {reserved.fix}",
                )
            )
    return problems


PLACEHOLDER_ROOT = "/mnt/models"


def served_model_path_placeholder(model: ModelConfig) -> str:
    """A representative model path for checks that do not care where the weights are."""
    return f"{PLACEHOLDER_ROOT}/{model.name}/{model.source.revision}"


def validation_node_roles(model: ModelConfig) -> list[NodeRole | None]:
    """The members whose arguments the validate-time check parses: the one pod of a one-node replica;
    the leader and a worker of a multi-node one, with the values LWS's webhook gives their variables
    (`LWS_WORKER_INDEX` 0 and 1; `LWS_LEADER_ADDRESS` is `<leader>.<leader>.<namespace>`, the leader
    pod `<lws>-<group>` under its group's own headless Service: components/leader_worker_set.py
    SUBDOMAIN_POLICY)."""
    if not model.is_multi_node:
        return [None]
    leader = f"{LEADER_WORKER_SET_NAME}-0"
    address = f"{leader}.{leader}.{model.namespace}"
    return [
        NodeRole(rank="0", leader_address=address, leader=True),
        NodeRole(rank="1", leader_address=address, leader=False),
    ]


def server_argument_problems(config: PlatformConfig) -> list[Problem]:
    """Validate-time check: every model's arguments as the pinned vLLM's parser would see them.

    Reserved flags in `vllm.extra_args` are reported here; everything else (flags the pinned vLLM
    does not know or dropped, bad choices, missing values) by `domain.vllm_flags`, whose findings are
    pinned on `extra_args` when the typed arguments alone pass and on `vllm` otherwise.
    """
    from domain.multi_node import model_versions
    from domain.vllm_flags import check_server_arguments

    problems: list[Problem] = []
    for at, model in model_versions(config):
        extra_at: tuple[str | int, ...] = (*at, "vllm", "extra_args")
        reserved = reserved_flag_problems(model.vllm.extra_args, extra_at)
        problems += reserved
        if reserved:
            continue  # the parser would only repeat the same flags less helpfully
        render = serves_render_endpoints(config, model)
        path = served_model_path_placeholder(model)
        found_before = len(problems)
        for role in validation_node_roles(model):
            arguments = build_server_arguments(
                model,
                path,
                render_endpoints=render,
                adapter_root=PLACEHOLDER_ROOT,
                tenants=bool(config.tenants),
                node_role=role,
            )
            typed = arguments[: len(arguments) - len(model.vllm.extra_args)]  # extras come last
            typed_findings = check_server_arguments(typed)
            problems += [Problem((*at, "vllm"), " ".join(typed), found) for found in typed_findings]
            for message in check_server_arguments(arguments):
                if message not in typed_findings:
                    problems.append(Problem(extra_at, list(model.vllm.extra_args), message))
            if len(problems) > found_before:
                break  # the worker's arguments would repeat the leader's findings
    return problems


# --- what probes, router and load balancer need of the server's flags ------------------------------

API_REACHERS = (
    "the startup, readiness and liveness probes (HTTP GET /health on the container port), the router "
    "and the Service / load balancer (plain HTTP to <pod IP>:vllm.port)"
)
"""Everything that reaches a vLLM pod: `--host 0.0.0.0 --port <vllm.port>` is the platform's own
(RESERVED_FLAGS), and these must find an OpenAI HTTP API on it."""


@dataclass(frozen=True)
class ListenerRule:
    """A `vllm serve` flag (by its parser `dest`) that, set as `breaks` says, takes the API off the
    port the probes, router and load balancer use (issue 40)."""

    dest: str
    breaks: str
    """`on`: any use of the flag (a switch turned on, or any value); `below-1`: a number below 1;
    `above-1`: a number above 1; `above-0`: a number above 0."""
    effect: str
    fix: str


LISTENER_RULES: tuple[ListenerRule, ...] = (
    ListenerRule(
        "headless",
        "on",
        "starts the engine without any API server (headless mode)",
        "remove it: a pod is one whole replica, API server included",
    ),
    ListenerRule(
        "api_server_count",
        "below-1",
        "starts no API-server process (vLLM runs headless with fewer than 1)",
        "remove it (one API server) or give a number of at least 1",
    ),
    ListenerRule(
        "uds",
        "on",
        "serves the API on a Unix socket and ignores --host and --port",
        "remove it: the pod must listen on vllm.port",
    ),
    ListenerRule(
        "grpc",
        "on",
        "serves vLLM's gRPC API instead of the OpenAI HTTP API",
        "remove it: the router and clients speak the OpenAI HTTP API",
    ),
    *(
        ListenerRule(
            dest,
            "on",
            "makes the server speak TLS (or ask for client certificates) on its port",
            "remove it: TLS ends at the load balancer (ingress.certificate_arn), and the probes, "
            "the router and the load balancer's targets speak plain HTTP to the pod",
        )
        for dest in (
            "ssl_keyfile",
            "ssl_certfile",
            "ssl_ca_certs",
            "ssl_cert_reqs",
            "ssl_ciphers",
            "enable_ssl_refresh",
        )
    ),
    ListenerRule(
        "nnodes",
        "above-1",
        "spreads one replica over several pods (nodes) and waits for them",
        "remove it: a replica is one pod of gpus_per_replica GPUs",
    ),
    ListenerRule(
        "node_rank",
        "above-0",
        "makes this pod a headless worker of another node's replica",
        "remove it: a replica is one pod of gpus_per_replica GPUs",
    ),
    *(
        ListenerRule(
            dest,
            "on",
            "makes the pod one data-parallel rank of a replica spread over pods",
            "remove it: one pod holds gpus_per_replica GPUs for tensor parallelism only; scale out "
            "with replicas",
        )
        for dest in (
            "data_parallel_rank",
            "data_parallel_start_rank",
            "data_parallel_external_lb",
            "data_parallel_hybrid_lb",
            "data_parallel_multi_port_external_lb",
        )
    ),
)
"""Every flag of the pinned vLLM that decides where and how the API listens; the others that look like
it are in LISTENER_FLAGS_THAT_KEEP_THE_PORT, and tests/test_vllm_listener_flags.py keeps the two lists
covering every such flag of the snapshot, so a vLLM bump that adds one fails a test."""

LISTENER_FLAGS_THAT_KEEP_THE_PORT: dict[str, str] = {
    "host": "the platform's own (--host 0.0.0.0), reserved",
    "port": "the platform's own (vllm.port), reserved",
    "middleware": "the platform's own (the API-key middleware), reserved",
    "api_key": "reserved: the key comes from the secret store",
    "root_path": "only the ASGI root_path FastAPI reports behind a path-prefixing proxy; routes stay at /",
    "grpc_port": "used only with --grpc (refused)",
    "disable_fastapi_docs": "removes /docs and /openapi.json only",
    "enable_offline_docs": "serves the docs' assets locally only",
    "disable_uvicorn_access_log": "logging only",
    "uvicorn_log_level": "logging only",
    "disable_access_log_for_endpoints": "logging only",
    "allowed_origins": "CORS headers only",
    "allowed_methods": "CORS headers only",
    "allowed_headers": "CORS headers only",
    "allow_credentials": "CORS headers only",
    "h11_max_incomplete_event_size": "a request-size bound of the HTTP parser",
    "h11_max_header_count": "a header-count bound of the HTTP parser",
    "enable_request_id_headers": "adds a response header only",
    "sse_keep_alive_interval": "comments on idle streams only",
    "enable_server_load_tracking": "a load counter only",
    "data_parallel_address": "used only with data parallelism (-dp, reserved)",
    "data_parallel_rpc_port": "used only with data parallelism (-dp, reserved)",
    "data_parallel_size_local": "used only with data parallelism (-dp, reserved)",
    "data_parallel_backend": "used only with data parallelism (-dp, reserved)",
    "data_parallel_supervisor_port": "used only with --data-parallel-multi-port-external-lb (refused)",
    "master_addr": "used only with --nnodes above 1 (refused)",
    "master_port": "used only with --nnodes above 1 (refused)",
}


def _flag_values(arguments: Sequence[str]) -> dict[str, tuple[str, str | None]]:
    """The last flag given for each parser `dest`, as (flag as written, its value or None for a switch;
    `--no-x` gives "false"), read with the pinned vLLM's snapshot so aliases (`-asc`) and underscores
    count (an unknown flag is the parser check's to report)."""
    from domain.vllm_flags import load_server_flags

    options = load_server_flags().options
    found: dict[str, tuple[str, str | None]] = {}
    for index, token in enumerate(arguments):
        name = flag_name(token)
        option = options.get(name) if name else None
        if name is None or option is None:
            continue
        inline = token.split("=", 1)[1] if "=" in token else None
        if not option.takes_value:
            found[option.dest] = (name, "false" if name.startswith("--no-") else None)
        elif inline is not None:
            found[option.dest] = (name, inline)
        elif index + 1 < len(arguments):
            found[option.dest] = (name, arguments[index + 1])
    return found


def _breaks(rule: ListenerRule, value: str | None) -> bool:
    if rule.breaks == "on":
        return value != "false"
    try:
        number = int(value or "")
    except ValueError:
        return False  # not a number: the parser check reports it
    return {"below-1": number < 1, "above-1": number > 1, "above-0": number > 0}[rule.breaks]


def listener_problems(arguments: Sequence[str]) -> list[tuple[str, str]]:
    """(flag, sentence) for every flag in `arguments` that takes the API off the pod's port."""
    values = _flag_values(arguments)
    found = []
    for rule in LISTENER_RULES:
        if rule.dest in values and _breaks(rule, values[rule.dest][1]):
            flag, value = values[rule.dest]
            shown = flag if value is None else f"{flag} {value}"
            found.append((flag, f"{shown} {rule.effect}, so {API_REACHERS} reach nothing; {rule.fix}"))
    return found


def listener_flag_problems(config: PlatformConfig) -> list[Problem]:
    """Validate-time check: no server flag in `vllm.extra_args` takes the API off the pod's port."""
    problems = []
    for index, model in enumerate(config.models):
        extra = model.vllm.extra_args
        for flag, message in listener_problems(extra):
            position = next(i for i, token in enumerate(extra) if flag_name(token) == flag)
            at = ("models", index, "vllm", "extra_args", position)
            problems.append(Problem(at, extra[position], message))
    return problems


def disables_statistics(arguments: Sequence[str]) -> str | None:
    """The flag in `arguments` (`--disable-log-stats`) with which vLLM 0.32.0 starts no stat logger, so
    `/metrics` holds none of its `vllm:*` series; None when absent (or turned off again)."""
    flag, value = _flag_values(arguments).get("disable_log_stats", (None, None))
    return flag if flag is not None and value != "false" else None
