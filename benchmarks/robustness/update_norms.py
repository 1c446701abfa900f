"""L2 norms of the clients' updates (reply minus the model sent) in the first rounds of a run without DP:
the measurement behind the clipping norm C of dp_fmnist.toml (DP-FedAvg is commonly clipped near the
median norm, Andrew et al., NeurIPS 2021).

    python benchmarks/robustness/update_norms.py --config configs/demo.toml --algorithm fedavg --rounds 3

Prints the number of updates and their median, minimum and maximum norm.
"""

from __future__ import annotations

import argparse
import math
import statistics

import fedtail
import fedtail.engine.executors as executors
from fedtail.engine.guard import outgoing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    norms: list[float] = []

    def measured(config, cid, seed, sent, reply, guard):
        keys = [k for k, v in reply.tensors.items() if v.is_floating_point() and k in sent.tensors]
        norms.append(math.sqrt(sum(float((reply.tensors[k].double() - sent.tensors[k].double()).square().sum()) for k in keys)))
        return outgoing(config, cid, seed, sent, reply, guard)

    executors.outgoing = measured  # the client runtime's hook (serial run: this process)
    fedtail.run(algorithm=args.algorithm, config=args.config, rounds=args.rounds, workers=1)
    print(f"{args.algorithm}: {len(norms)} updates in {args.rounds} rounds; L2 norm median {statistics.median(norms):.4f}, "
          f"min {min(norms):.4f}, max {max(norms):.4f}")


if __name__ == "__main__":
    main()
