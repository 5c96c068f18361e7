"""Register the benchmark's replicas with the router through the stack's registrar code.

    python bench/router/register.py ROUTER_URL MODEL POLICY WORKER_URL...
"""

import sys

from router.registrar import RouterClient, Worker, reconcile

if __name__ == "__main__":
    router_url, model, policy, *urls = sys.argv[1:]
    added, removed = reconcile(RouterClient(router_url), {url: Worker(url, model, policy) for url in urls})
    print(f"registered {added} as {model} ({policy}); removed {removed}")
