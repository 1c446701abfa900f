"""Internal entry point of ``fedtail sweep``: one run in its own process.

    python -m fedtail.sweep.runone RUN_DIR < config.json

The config (a full ``config.json`` dict) is validated with :func:`fedtail.components.build_config`,
literally (the sweep already filled in the algorithm's reference settings), and run with the
same :func:`fedtail.runner.run_to_folder` as ``fedtail run``; a checkpoint of the same config in
RUN_DIR is resumed from. Each evaluation prints one line (round, accuracy,
elapsed time), so ``run.log`` shows a long run's progress.
Exit codes:
0 finished, 2 bad input (one ``error:`` line), 3 diverged (one ``error:`` line; ``summary.json``
says so), 1 the run crashed (traceback, ``FAILED``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m fedtail.sweep.runone RUN_DIR < config.json", file=sys.stderr)
        return 2
    from fedtail.components import build_config
    from fedtail.errors import FedtailError, RunDiverged
    from fedtail.machine import describe, machine_info
    from fedtail.provenance import code_info, describe_code
    from fedtail.engine.callbacks import OnRound
    from fedtail.runner import run_to_folder

    # each piece of a resumed run names its own code and machine
    print(f"code: {describe_code(code_info())}", flush=True)
    print(f"machine: {describe(machine_info())}", flush=True)

    try:
        # the planned config is complete: read it literally, no reference settings filled in
        config = build_config(json.loads(sys.stdin.read()), reference=False)
        summary = run_to_folder(config, Path(args[0]), [OnRound(_progress(config.rounds))], resume=None)
    except FedtailError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RunDiverged as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except json.JSONDecodeError as err:
        print(f"error: the config on stdin is not JSON ({err})", file=sys.stderr)
        return 2
    final, best = summary["final"], summary["best"]
    print(
        f"finished: final personalized_acc {final['personalized_acc']:.4f} (round {final['round']}), "
        f"best {best['personalized_acc']:.4f} (round {best['round']}), wall {summary['wall_time_s']:.1f} s"
    )
    return 0


def _progress(rounds: int):
    started = False

    def on_round(rnd: int, row: dict | None) -> None:
        nonlocal started
        if not started and rnd > 0:  # the first call names the round the run starts after
            print(f"resuming from the checkpoint after round {rnd}/{rounds}", flush=True)
        started = True
        if row is not None:
            acc = row.get("personalized_acc")
            shown = f"{acc:.4f}" if isinstance(acc, float) else "n/a"
            seconds = row.get("elapsed_s")  # the run's time: earlier pieces in, stops out (engine/clock.py)
            when = f"{seconds:.0f} s" if isinstance(seconds, (int, float)) else "n/a"
            print(f"round {rnd}/{rounds}: personalized_acc {shown}, {when}", flush=True)

    return on_round


if __name__ == "__main__":
    sys.exit(main())
