"""fedtail messages <-> Flower records, and the bytes a Flower message puts on the wire.

A fedtail :class:`~fedtail.algorithms.base.Message` of client ``cid`` becomes four records of one
Flower ``RecordDict``, named after the client (a node's message carries the tasks of every
client it hosts):

- ``"{cid}.tensors"``: an ``ArrayRecord`` of the named tensors (numpy ``.npy`` bytes: every value
  bit for bit, with its dtype and shape);
- ``"{cid}.config"``: a ``ConfigRecord`` of the message's small instructions;
- ``"{cid}.metrics"``: a ``MetricRecord`` of the numbers it reports;
- ``"{cid}.head"``: a ``ConfigRecord`` with the kind and the names of channels-last tensors (the
  engine's CNN weights are channels-last; the layout is restored so that server-side arithmetic
  on received tensors is the simulator's, rounding included).

Imports Flower when called, never at import time.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from fedtail.algorithms.base import Message


def _to_numpy(name: str, tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        raise TypeError(f"tensor {name!r} is bfloat16, which numpy (and so a Flower Array) cannot hold")
    return tensor.detach().cpu().contiguous().numpy()


def _scalar(value: Any, where: str) -> Any:
    """A config or metric value as a type Flower records hold (numpy scalars become Python ones)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    raise TypeError(f"{where}: a {type(value).__name__} cannot be sent in a Flower record")


def put_message(content: Any, cid: int, msg: Message) -> None:
    """Add client ``cid``'s ``msg`` to the Flower ``RecordDict`` ``content``."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord

    arrays = ArrayRecord()
    channels_last = []
    for name, tensor in msg.tensors.items():
        if tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last):
            channels_last.append(name)
        arrays[name] = Array(_to_numpy(name, tensor))
    content[f"{cid}.tensors"] = arrays
    content[f"{cid}.config"] = ConfigRecord({k: _scalar(v, f"config {k!r}") for k, v in msg.config.items()})
    metrics = {k: _scalar(v, f"metric {k!r}") for k, v in msg.metrics.items()}
    if any(isinstance(v, (str, bytes, bool)) for v in metrics.values()):
        raise TypeError(f"client {cid}: metrics must be numbers ({msg.metrics})")
    content[f"{cid}.metrics"] = MetricRecord(metrics)
    content[f"{cid}.head"] = ConfigRecord({"kind": msg.kind, "channels_last": channels_last})


def get_message(content: Any, cid: int) -> Message:
    """Client ``cid``'s message from a Flower ``RecordDict`` written by :func:`put_message`."""
    head = content.config_records[f"{cid}.head"]
    channels_last = set(head["channels_last"])
    tensors = {}
    for name, array in content.array_records[f"{cid}.tensors"].items():
        tensor = torch.from_numpy(np.array(array.numpy(), copy=True))
        if name in channels_last:
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        tensors[name] = tensor
    config = dict(content.config_records[f"{cid}.config"])
    metrics = dict(content.metric_records[f"{cid}.metrics"])
    return Message(kind=str(head["kind"]), tensors=tensors, config=config, metrics=metrics)


def wire_bytes(message: Any) -> int:
    """Bytes a Flower message puts on the wire: its serialised objects (head, records, array chunks).

    Counted as Flower serialises them for the transfer: each distinct object once per message, so
    an array that several clients of one node receive (the global model) counts once. HTTP and TLS
    framing are not included.
    """
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())
