"""What the engine accepts from clients, which clients fail, and when a run has diverged.

Everything here sits between the transport (the simulator's executors, or Flower's grid) and
the algorithm's server half, so no algorithm checks anything itself and every algorithm gets the
same rules in the simulator and on Flower (:class:`Channel`).

**Dropouts** (``--dropout P``): each client messaged in round r (the sampled ones, and any
other a server half asks, as FedGroup's pre-training set) fails for the whole round with
probability P, drawn from (seed, r, client) only, so a run and its resume, serial or with
``--workers``, lose the same clients. A failed client is sent its messages (the bytes count) but
runs nothing and replies nothing; its state does not change.

**Validation** (:class:`ReplyCheck`), before a server half sees a reply:

- *non-finite*: a NaN or inf in a floating tensor, in a reported metric (``train_loss``, ...),
  or in the client state the call left behind (where the engine holds it, as in the
  simulator). With ``--on-nonfinite stop`` (the default) the run stops as diverged
  (:class:`~fedtail.errors.RunDiverged`); with ``reject`` the reply is rejected;
- *shapes and dtypes*: a tensor returned under a name it was sent with keeps that tensor's shape
  and dtype; a tensor named after an entry of the run's model (``name`` or ``prefix/name``) has
  that entry's shape and dtype;
- *names*: replies to messages of one signature (kind, and the names, shapes and dtypes of the
  tensors sent) must share one schema (tensor names and dtypes; shapes may differ, as per-class
  statistics of the classes a client holds do). The schema is learnt from the first exchange
  that uses the signature: the one most of its replies share (on a tie, the one of the lowest
  client id). Replies with missing or extra names, or another dtype, are rejected. Schemas are
  not checkpointed: a resumed run learns them again;
- *norm* (``--max-update-norm X``): the L2 distance between the tensors a client returns under the
  names it was sent and those it was sent must not exceed X.

A rejected reply is never aggregated and the client's state from that call is dropped. Per
round, the log records ``sampled``, ``replied``, ``dropped``, ``rejected`` and the reasons, and
``missing`` (the clients whose answer never came: a Flower node that died or timed out) when
there are any.

**Skipped rounds**: an exchange with fewer accepted replies than ``--min-replies`` (at most the
number of clients messaged; always at least one) ends the round: the engine restores the server
and edge state from before the round and logs it as skipped. Server halves therefore never see
an exchange without replies; they do see exchanges where some clients they messaged are absent.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from fedtail import wire
from fedtail.algorithms.aggregate import Rule
from fedtail.algorithms.base import Message, Tensors
from fedtail.config import FaultConfig
from fedtail.engine.device import to_host
from fedtail.errors import RunDiverged

Schema = tuple[tuple[str, str], ...]  # sorted (name, dtype) of a reply's tensors
Signature = tuple[str, tuple[tuple[str, tuple[int, ...], str], ...]]  # kind, sorted (name, shape, dtype) sent


class RoundSkipped(Exception):
    """Raised through a server half's ``run_round``: too few replies; the engine undoes the round."""


def schema(tensors: Tensors) -> Schema:
    return tuple(sorted((name, str(t.dtype)) for name, t in tensors.items()))


def signature(msg: Message) -> Signature:
    """What a reply's schema may depend on: the message's kind and the tensors sent."""
    return msg.kind, tuple(sorted((name, tuple(t.shape), str(t.dtype)) for name, t in msg.tensors.items()))


def nonfinite_at(value: Any, where: str = "") -> str | None:
    """The path of the first NaN / inf inside ``value`` (tensors, arrays, numbers, containers)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            return None if bool(torch.isfinite(value).all()) else where or "tensor"
        return None
    if isinstance(value, np.ndarray):
        if np.issubdtype(value.dtype, np.inexact):
            return None if bool(np.isfinite(value).all()) else where or "array"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else where or "value"
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = nonfinite_at(item, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def fails(seed: int, rnd: int, cid: int, p: float) -> bool:
    """Whether client ``cid`` fails to reply in round ``rnd``: a function of (seed, round, client) only."""
    if p <= 0:
        return False
    from fedtail.engine.context import derive_seed

    return bool(np.random.default_rng(derive_seed(seed, 0xD209, rnd, cid)).random() < p)


def dropped_clients(seed: int, rnd: int, clients: list[int], p: float) -> set[int]:
    """Those of ``clients`` that fail to reply in round ``rnd``."""
    return {c for c in clients if fails(seed, rnd, c, p)}


@dataclass
class Verdict:
    reason: str | None = None  # why the reply is rejected (None: accepted)
    nonfinite: bool = False  # the reason is a NaN / inf (a divergence under on_nonfinite="stop")


class ReplyCheck:
    """The rules a reply must pass (module docstring); one per run, server side."""

    def __init__(self, faults: FaultConfig, model: Mapping[str, torch.Tensor]) -> None:
        self.faults = faults
        self.model = {name: (tuple(t.shape), str(t.dtype)) for name, t in model.items()}
        self.schemas: dict[Signature, Schema] = {}

    def knows(self, msg: Message) -> bool:
        return signature(msg) in self.schemas

    def learn(self, pairs: list[tuple[int, Message, Message]]) -> None:
        """Learn the schema of each new signature from the replies ``(cid, sent, reply)`` of one exchange."""
        groups: dict[Signature, list[tuple[int, Schema]]] = {}
        for cid, sent, reply in pairs:
            sig = signature(sent)
            if sig not in self.schemas:
                groups.setdefault(sig, []).append((cid, schema(reply.tensors)))
        for sig, seen in groups.items():
            counts = Counter(s for _, s in seen)
            first = {}
            for cid, s in sorted(seen):
                first.setdefault(s, cid)
            self.schemas[sig] = max(counts, key=lambda s: (counts[s], -first[s]))

    def verdict(self, sent: Message, reply: Message, state: Any = None, state_nonfinite: str | None = None) -> Verdict:
        """``state_nonfinite``: where the state holds NaN / inf, as found where it is kept (a Flower node)."""
        where = nonfinite_at(reply.metrics)
        if where:
            return Verdict(f"non-finite {where} reported", nonfinite=True)
        if where := nonfinite_at(reply.tensors):
            return Verdict(f"non-finite tensor {where}", nonfinite=True)
        if state is not None and (where := nonfinite_at(state)):
            return Verdict(f"non-finite client state {where}", nonfinite=True)
        if state_nonfinite:
            return Verdict(f"non-finite client state {state_nonfinite}", nonfinite=True)
        for name, t in reply.tensors.items():
            ref = sent.tensors.get(name)
            expected = (tuple(ref.shape), str(ref.dtype)) if ref is not None else self.model.get(name.rsplit("/", 1)[-1])
            got = (tuple(t.shape), str(t.dtype))
            if expected is not None and got != expected:
                return Verdict(f"{name}: shape {list(got[0])} {got[1]}, expected {list(expected[0])} {expected[1]}")
        known = self.schemas.get(signature(sent))
        if known is not None and (got_schema := schema(reply.tensors)) != known:
            names, want = {n for n, _ in got_schema}, {n for n, _ in known}
            if names != want:
                missing, extra = sorted(want - names)[:3], sorted(names - want)[:3]
                return Verdict(f"tensor names differ: missing {missing}, extra {extra}")
            other = sorted(set(got_schema) - set(known))[:3]
            return Verdict(f"tensor dtypes differ from the other replies: {other}")
        bound = self.faults.max_update_norm
        if bound is not None:
            sq = sum(
                float((t.double() - sent.tensors[n].double()).pow(2).sum())
                for n, t in reply.tensors.items()
                if n in sent.tensors and t.is_floating_point()
            )
            if math.sqrt(sq) > bound:
                return Verdict(f"update norm {math.sqrt(sq):.4g} > --max-update-norm {bound:g}")
        return Verdict()


@dataclass
class Delivered:
    """One client's answer as a transport hands it over."""

    cid: int
    reply: Message
    seconds: float = 0.0  # the client's compute time
    state: Any = None  # the client's state after the call, where the engine holds it (simulator)
    state_nonfinite: str | None = None  # where that state holds NaN / inf, when it is kept elsewhere (Flower nodes)
    parked: bool = False  # the state waits in the transport's store until the answer is accepted (see Channel._hold)


@dataclass
class RoundFaults:
    """One round's dropouts and rejections, for its log.

    ``replied`` and ``dropped`` count the distinct clients messaged in the round (the sampled ones,
    plus any other a server half asked). ``missing``: clients whose answer never came (a transport
    that can lose them: a Flower node that died or timed out); logged only when there are any.
    """

    sampled: int
    messaged: set[int] = field(default_factory=set)
    dropped: set[int] = field(default_factory=set)
    missing: set[int] = field(default_factory=set)
    rejected: list[str] = field(default_factory=list)
    skipped: str | None = None

    def log(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sampled": self.sampled,
            "replied": len(self.messaged - self.dropped - self.missing),
            "dropped": len(self.dropped),
            "rejected": len(self.rejected),
        }
        if self.missing:
            out["missing"] = sorted(self.missing)
        if self.rejected:
            out["rejections"] = self.rejected
        if self.skipped:
            out["skipped"] = self.skipped
        return out


class Channel:
    """The engine's side of :class:`~fedtail.algorithms.base.Comm` for one round, transport aside.

    A transport subclasses it and implements :meth:`_deliver` (send messages, yield answers in
    client-id order; a client it yields no answer for is *missing*: its reply is lost, as a
    dropped client's), :meth:`_accept` (commit what an accepted answer leaves behind), :meth:`_reject`
    (forget what a rejected one set aside) and, for the
    edge tier, :meth:`_edge_reduce`. Dropouts, validation, the minimum number of replies, the
    round's training loss and the byte counts are handled here, once.
    """

    def __init__(self, rnd: int, clients: list[int], check: ReplyCheck, faults: FaultConfig, seed: int,
                 edge_of: np.ndarray | None = None) -> None:
        self.rnd = rnd
        self.seed = seed
        self.check = check
        self.faults = faults
        self.edge_of = edge_of
        self.calls = 0
        self.logged: dict[str, Any] = {}
        self.round = RoundFaults(len(clients))
        self.loss_sum = 0.0
        self.loss_samples = 0.0
        self.bytes_down = 0
        self.bytes_up = 0
        self.bytes_edge_up = 0
        self.samples = 0

    # -- transport hooks -------------------------------------------------------------------------
    def _deliver(self, messages: dict[int, Message], call: int) -> Iterator[Delivered]:
        raise NotImplementedError

    def _accept(self, answer: Delivered) -> None:
        """An accepted answer: keep the client's new state (where the engine holds it)."""

    def _reject(self, answer: Delivered) -> None:
        """A rejected answer: forget the state it left aside, if any (``parked``)."""

    def _edge_reduce(self, edge_id: int, replies: dict[int, Message]) -> dict[int, Message]:
        raise NotImplementedError

    def _hold(self, answer: Delivered) -> Delivered:
        """An answer kept until every answer of the exchange has come (a new schema is learnt from them
        all): a transport may set its state aside meanwhile (``parked``), so they are not all in memory."""
        return answer

    # -- Comm ------------------------------------------------------------------------------------
    def stream(self, messages: Mapping[int, Message]) -> Iterator[tuple[int, Message]]:
        call = self.calls
        self.calls += 1
        live = {}
        for cid in sorted(messages):
            self.bytes_down += messages[cid].nbytes
            if cid not in self.round.messaged:
                self.round.messaged.add(cid)
                if fails(self.seed, self.rnd, cid, self.faults.dropout):
                    self.round.dropped.add(cid)
            if cid not in self.round.dropped:
                live[cid] = to_host(messages[cid])  # messages are device-neutral (fedtail.engine.device)
        # a robust rule's fewest inputs (fedtail.algorithms.aggregate) skips a round short of them too
        need = max(min(self.faults.min_replies, len(messages)), Rule.parse(self.faults.aggregate).min_inputs)
        if len(live) < need:
            raise RoundSkipped(f"{len(live)} of {len(messages)} clients replied, fewer than {need}")
        answers = self._deliver(live, call)
        if not all(self.check.knows(m) for m in live.values()):
            # a new signature: its schema is learnt from all of this exchange's replies
            answers = [self._hold(a) for a in answers]
            self.check.learn([(a.cid, live[a.cid], a.reply) for a in answers])
        accepted = 0
        answered = set()
        for answer in answers:
            answered.add(answer.cid)
            if self._take(answer, live[answer.cid]):
                accepted += 1
                yield answer.cid, answer.reply
        self.round.missing |= set(live) - answered
        if accepted < need:
            raise RoundSkipped(f"{accepted} replies accepted, fewer than {need}")

    def exchange(self, messages: Mapping[int, Message]) -> dict[int, Message]:
        return dict(self.stream(messages))

    def exchange_via_edges(self, messages: Mapping[int, Message]) -> dict[int, dict[int, Message]]:
        by_edge: dict[int, dict[int, Message]] = {}
        for cid, reply in self.stream(messages):
            by_edge.setdefault(int(self.edge_of[cid]), {})[cid] = reply
        out = {}
        for edge_id in sorted(by_edge):
            forwarded = {k: to_host(m) for k, m in self._edge_reduce(edge_id, by_edge[edge_id]).items()}
            self.bytes_edge_up += sum(m.nbytes for m in forwarded.values())
            out[edge_id] = forwarded
        return out

    def log(self, **values: Any) -> None:
        self.logged.update(values)

    # -- bookkeeping -------------------------------------------------------------------------------
    def _take(self, answer: Delivered, sent: Message) -> bool:
        reply = answer.reply
        self.bytes_up += reply.nbytes
        verdict = self.check.verdict(sent, reply, answer.state, answer.state_nonfinite)
        if verdict.reason is None:
            self.samples += int(reply.metrics.get(wire.NUM_SAMPLES, 0))
            n = reply.metrics.get(wire.NUM_SAMPLES, 0.0)
            if n and wire.TRAIN_LOSS in reply.metrics:
                self.loss_sum += reply.metrics[wire.TRAIN_LOSS] * n
                self.loss_samples += n
            self._accept(answer)
            return True
        why = f"client {answer.cid}: {verdict.reason}"
        self.round.rejected.append(why)
        self._reject(answer)
        if verdict.nonfinite and self.faults.on_nonfinite == "stop":
            raise RunDiverged(self.rnd, why)
        return False

    @property
    def train_loss(self) -> float | None:
        """Sample-weighted mean training loss of the round's accepted replies."""
        return self.loss_sum / self.loss_samples if self.loss_samples else None
