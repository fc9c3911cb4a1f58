"""traceread collect around a multi-node torchrun job on a Ray cluster, as a Ray job.

One Ray task per node (a STRICT_SPREAD placement group: one bundle per node) runs
``traceread collect -o RUN --layout per-host -- torchrun --nnodes N --node-rank i ...`` on its node;
the first node is the rendezvous host. RUN must be on storage every node sees (NFS, a mounted bucket).

    ray job submit --working-dir . -- python collectors/ray/launch.py \\
        --nodes 2 --gpus-per-node 8 --run /shared/runs/exp1 -- train.py --lr 3e-4
    traceread report /shared/runs/exp1

Ray Train's ``TorchTrainer`` starts its workers from the raylet, not from a command line, so
``traceread collect`` cannot wrap them; run the training script under torchrun this way instead, or
keep Ray Train and profile with its own ``torch.profiler`` callback (traceread report reads those
traces too). ``--pack`` places every node's task on whatever nodes have room (a one-machine cluster in
tests); then each task gets its own run sub-folder name through ``TRACEREAD_HOST_FOLDER``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys


def node_command(args: argparse.Namespace, node_rank: int, head: str) -> list[str]:
    return ["traceread", "collect", "-o", args.run, "--layout", "per-host", *shlex.split(args.collect_args), "--",
            "torchrun", "--nnodes", str(args.nodes), "--nproc-per-node", str(args.gpus_per_node),
            "--node-rank", str(node_rank), "--master-addr", head, "--master-port", str(args.port), *args.train]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--run", required=True, help="the run folder, on storage every node sees")
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("--collect-args", default="", help='extra traceread collect options, e.g. "--hang-timeout 600"')
    ap.add_argument("--pack", action="store_true", help="allow several nodes' tasks on one machine (tests)")
    ap.add_argument("--address", default=None, help="Ray address (default: the job's cluster)")
    ap.add_argument("train", nargs=argparse.REMAINDER, help="-- then the training script and its arguments")
    args = ap.parse_args()
    args.train = [a for a in args.train if a != "--"] if args.train[:1] == ["--"] else args.train
    if not args.train:
        ap.error("give the training script after --")

    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address=args.address or os.environ.get("RAY_ADDRESS") or None, include_dashboard=False, log_to_driver=True)
    gpus = 0 if args.pack else args.gpus_per_node
    pg = placement_group([{"CPU": 1, "GPU": gpus} if gpus else {"CPU": 1}] * args.nodes,
                         strategy="PACK" if args.pack else "STRICT_SPREAD")
    ray.get(pg.ready())

    @ray.remote(num_cpus=1, num_gpus=gpus)
    def node_ip() -> str:
        return ray.util.get_node_ip_address()

    @ray.remote(num_cpus=1, num_gpus=gpus)
    def run_node(cmd: list[str], folder: str | None) -> tuple[str, int]:
        env = dict(os.environ)
        if folder:
            env["TRACEREAD_HOST_FOLDER"] = folder
        return socket.gethostname(), subprocess.call(cmd, env=env)

    def on(i: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)

    head = ray.get(node_ip.options(scheduling_strategy=on(0)).remote())
    runs = [run_node.options(scheduling_strategy=on(i)).remote(node_command(args, i, head),
                                                                  f"node{i}" if args.pack else None)
            for i in range(args.nodes)]
    codes = ray.get(runs)
    for i, (host, code) in enumerate(codes):
        print(f"node {i} ({host}): exit code {code}", file=sys.stderr)
    print(f"traceread: traces in {args.run} — traceread report {args.run}", file=sys.stderr)
    return max(code for _host, code in codes)


if __name__ == "__main__":
    sys.exit(main())
