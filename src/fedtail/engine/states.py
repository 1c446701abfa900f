"""Where clients' persistent state (``ctx.state``) lives: one protocol, :class:`ClientStates`.

A store maps a client id to its *accepted* state and holds at most one *pending* state per
client: the state a task produced, kept aside (:meth:`~ClientStates.hold`) until the server
accepts the task's reply (:meth:`~ClientStates.accept`) or forgets it
(:meth:`~ClientStates.drop`: the reply was rejected or lost). Pending states are tagged by the
(round, call) that made them, so an accept that arrives twice, or for another call, is harmless.
Three stores implement it: :class:`MemoryStates` and :class:`DiskStates` in the simulator
(``--client-state``), and a Flower node's (:class:`fedtail.flower.node.StateStore`, its states
on the node's disk, fsynced).

``memory`` (default): :class:`MemoryStates`, a dict client id -> state. ``disk``: :class:`DiskStates`, the same mapping
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

Tag = tuple[int, int]  # (round, call) of the task whose reply a pending state waits on

from fedtail.engine import checkpoint

FOLDER = ".client-state"  # inside the run folder


class ClientStates(MutableMapping):
    """The protocol of a client-state store (module docstring): the mapping of accepted states
    (client id -> state dict; ``get(cid, {})`` before a client's first accepted reply) plus one
    pending state per client, and :meth:`close` when the run ends."""

    def hold(self, cid: int, state: dict[str, Any], tag: Tag | None = None) -> None:
        """Keep ``state`` as client ``cid``'s pending state (not its state until :meth:`accept`)."""
        raise NotImplementedError

    def accept(self, cid: int, tag: Tag | None = None) -> bool:
        """Make the pending state (of ``tag``, if given) the client's state; True when it is the
        client's state now (or already was)."""
        raise NotImplementedError

    def drop(self, cid: int) -> None:
        """Forget client ``cid``'s pending state, if any (its reply was not accepted)."""
        raise NotImplementedError

    def close(self) -> None:
        """The run has ended: release what the store holds (a disk store removes its folder)."""


class MemoryStates(ClientStates):
    """Client id -> state in this process's memory; a pending state is the very object held."""

    def __init__(self) -> None:
        self._states: dict[int, dict[str, Any]] = {}
        self._pending: dict[int, tuple[Tag | None, dict[str, Any]]] = {}

    def __getitem__(self, cid: int) -> dict[str, Any]:
        return self._states[cid]

    def __setitem__(self, cid: int, state: dict[str, Any]) -> None:
        self._states[int(cid)] = state

    def __delitem__(self, cid: int) -> None:
        del self._states[cid]

    def __contains__(self, cid: object) -> bool:
        return cid in self._states

    def __iter__(self) -> Iterator[int]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def hold(self, cid: int, state: dict[str, Any], tag: Tag | None = None) -> None:
        self._pending[int(cid)] = (tag, state)

    def accept(self, cid: int, tag: Tag | None = None) -> bool:
        held = self._pending.get(int(cid))
        if held is not None and (tag is None or held[0] == tag):
            self._states[int(cid)] = self._pending.pop(int(cid))[1]
            return True
        return int(cid) in self._states and tag is None

    def drop(self, cid: int) -> None:
        self._pending.pop(int(cid), None)

    def close(self) -> None:
        self._pending.clear()


class DiskStates(ClientStates):
    """Client id -> state dict, stored as one file per client and loaded on access.

    A value read is a fresh copy (changing it changes nothing on disk until it is assigned).
    ``folder`` is emptied first: what a killed run left there is superseded by its checkpoint.
    A pending state is a second file per client (``client-N.pending.pt``).
    """

    def __init__(self, folder: str | Path | None = None) -> None:
        if folder is None:
            self.dir = Path(tempfile.mkdtemp(prefix="fedtail-client-state-"))
        else:
            self.dir = Path(folder)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir.mkdir(parents=True)
        self._ids: set[int] = set()
        self._tags: dict[int, Tag | None] = {}

    def _path(self, cid: int, pending: bool = False) -> Path:
        return self.dir / (f"client-{cid}.pending.pt" if pending else f"client-{cid}.pt")

    def _write(self, path: Path, cid: int, state: dict[str, Any]) -> None:
        if not self.dir.is_dir():
            raise RuntimeError(f"the client states in {self.dir} were closed (the run has ended)")
        tmp = path.with_name(path.name + ".tmp")
        with checkpoint.open_private(tmp) as fh:
            torch.save(checkpoint.encode(state, f"client {cid}'s state"), fh)
        os.replace(tmp, path)  # no fsync: the folder lives as long as the run, checkpoints are the durable copy

    def __getitem__(self, cid: int) -> dict[str, Any]:
        if cid not in self._ids:
            raise KeyError(cid)
        return checkpoint.decode(torch.load(self._path(cid), map_location="cpu", weights_only=True))

    def __setitem__(self, cid: int, state: dict[str, Any]) -> None:
        self._write(self._path(int(cid)), cid, state)
        self._ids.add(int(cid))

    def hold(self, cid: int, state: dict[str, Any], tag: Tag | None = None) -> None:
        self._write(self._path(int(cid), pending=True), cid, state)
        self._tags[int(cid)] = tag

    def accept(self, cid: int, tag: Tag | None = None) -> bool:
        cid = int(cid)
        if cid in self._tags and (tag is None or self._tags[cid] == tag):
            os.replace(self._path(cid, pending=True), self._path(cid))
            del self._tags[cid]
            self._ids.add(cid)
            return True
        return cid in self._ids and tag is None

    def drop(self, cid: int) -> None:
        self._tags.pop(int(cid), None)
        self._path(int(cid), pending=True).unlink(missing_ok=True)

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
        self._tags.clear()


def make_states(kind: str, run_dir: str | Path | None) -> ClientStates:
    """The store ``--client-state`` names: :class:`MemoryStates`, or :class:`DiskStates` in ``run_dir/.client-state``."""
    if kind == "memory":
        return MemoryStates()
    if kind == "disk":
        return DiskStates(None if run_dir is None else Path(run_dir) / FOLDER)
    raise ValueError(f"--client-state must be memory or disk (got {kind!r})")
