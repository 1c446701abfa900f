"""Where the simulator keeps its clients' persistent state (``ctx.state``): ``--client-state``.

``memory`` (default): a dict client id -> state. ``disk``: :class:`DiskStates`, the same mapping
with one file per client (``torch.save`` of the checkpoint module's plain containers) in a
folder of the run directory, read when a client's task is built and written when its reply is
accepted. With 1,000 clients holding personal models, only the states of the clients being
served are in memory (the engine builds the tasks of an exchange or an evaluation one at a
time, see ``Simulation``; while an exchange's replies are all gathered to learn a new reply
schema, their states wait on disk as pending until accepted). The folder is removed when the run ends; the run's checkpoints still
hold every state (a checkpoint reads them all while it is written). Results do not depend on
the choice.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Iterator

import torch

from fedtail.engine import checkpoint

FOLDER = ".client-state"  # inside the run folder


class DiskStates(MutableMapping):
    """Client id -> state dict, stored as one file per client and loaded on access.

    A value read is a fresh copy (changing it changes nothing on disk until it is assigned).
    ``folder`` is emptied first: what a killed run left there is superseded by its checkpoint.
    """

    def __init__(self, folder: str | Path | None = None) -> None:
        if folder is None:
            self.dir = Path(tempfile.mkdtemp(prefix="fedtail-client-state-"))
        else:
            self.dir = Path(folder)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir.mkdir(parents=True)
        self._ids: set[int] = set()

    def _path(self, cid: int, pending: bool = False) -> Path:
        return self.dir / (f"client-{cid}.pending.pt" if pending else f"client-{cid}.pt")

    def _write(self, path: Path, cid: int, state: dict[str, Any]) -> None:
        if not self.dir.is_dir():
            raise RuntimeError(f"the client states in {self.dir} were closed (the run has ended)")
        tmp = path.with_name(path.name + ".tmp")
        torch.save(checkpoint.encode(state, f"client {cid}'s state"), tmp)
        os.replace(tmp, path)  # no fsync: the folder lives as long as the run, checkpoints are the durable copy

    def __getitem__(self, cid: int) -> dict[str, Any]:
        if cid not in self._ids:
            raise KeyError(cid)
        return checkpoint.decode(torch.load(self._path(cid), map_location="cpu", weights_only=True))

    def __setitem__(self, cid: int, state: dict[str, Any]) -> None:
        self._write(self._path(int(cid)), cid, state)
        self._ids.add(int(cid))

    def park(self, cid: int, state: dict[str, Any]) -> None:
        """Keep ``state`` as client ``cid``'s pending state (not its state until :meth:`unpark`)."""
        self._write(self._path(int(cid), pending=True), cid, state)

    def unpark(self, cid: int) -> None:
        """Make the pending state of :meth:`park` the client's state (a pending one never unparked is ignored)."""
        os.replace(self._path(int(cid), pending=True), self._path(int(cid)))
        self._ids.add(int(cid))

    def __delitem__(self, cid: int) -> None:
        if cid not in self._ids:
            raise KeyError(cid)
        self._path(cid).unlink(missing_ok=True)
        self._ids.discard(cid)

    def __contains__(self, cid: object) -> bool:
        return cid in self._ids

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._ids))

    def __len__(self) -> int:
        return len(self._ids)

    def close(self) -> None:
        """Remove the folder and every state in it."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self._ids.clear()


def make_states(kind: str, run_dir: str | Path | None) -> MutableMapping:
    """The store ``--client-state`` names: a dict, or a :class:`DiskStates` in ``run_dir/.client-state``."""
    if kind == "memory":
        return {}
    if kind == "disk":
        return DiskStates(None if run_dir is None else Path(run_dir) / FOLDER)
    raise ValueError(f"--client-state must be memory or disk (got {kind!r})")
