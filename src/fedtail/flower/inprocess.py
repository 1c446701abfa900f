"""A Flower ``Grid`` whose SuperNodes are in this process: the adapter without a network.

:class:`InProcessGrid` hands every message to the real ``client_app`` of
:mod:`fedtail.flower.apps`, each node with its own node config, after a round trip through
Flower's serialisation (the objects a transfer would carry, deflated and inflated again), and
keeps the replies for ``pull_messages``. It is what the adapter tests run the ServerApp's code on
(``make test``), and a quick way to try a deployment's node configs; nodes can be taken offline
to see the fault handling.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.task_identity import TaskIdentity


def over_the_wire(message: Message) -> Message:
    """``message`` after Flower's serialisation: deflated to bytes, inflated again."""
    objects = get_all_nested_objects(message)
    contents = {oid: obj.deflate() for oid, obj in objects.items()}
    copy = inflate_object_from_contents(message.object_id, contents)
    copy.metadata.__dict__["_message_id"] = message.metadata.message_id
    return copy


class InProcessGrid(Grid):
    """SuperNodes in this process; ``node_configs`` maps a node id to its ``--node-config`` values."""

    def __init__(self, node_configs: dict[int, dict[str, Any]], run_config: dict[str, Any], run_id: int = 1) -> None:
        from fedtail.flower.apps import client_app

        self.client_app = client_app
        self.node_configs = dict(node_configs)
        self.run_config = dict(run_config)
        self.run_id = run_id
        self.offline: set[int] = set()
        self.replies: dict[str, Message] = {}
        self.delivered: list[tuple[int, str]] = []  # (node, message type) of every message a node answered
        self._ids = itertools.count()
        self._run: Any = None
        # Messages take their run and sender from the process's task identity, which Flower sets
        # in the processes it starts; here this process plays the ServerApp's part.
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 1, 1

    # -- Grid -------------------------------------------------------------------------------------------
    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.node_configs if n not in self.offline]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            mid = f"m{next(self._ids)}"
            message.metadata.__dict__["_message_id"] = mid
            ids.append(mid)
            node = message.metadata.dst_node_id
            if node in self.offline:
                continue  # never answered: the server's wait ends by its timeout or liveness check
            context = Context(self.run_id, node, dict(self.node_configs[node]), RecordDict(), self.run_config)
            reply = self.client_app(over_the_wire(message), context)
            reply.metadata.__dict__["_message_id"] = f"r{mid}"
            self.replies[mid] = over_the_wire(reply)
            self.delivered.append((node, message.metadata.message_type))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.replies.pop(mid) for mid in message_ids if mid in self.replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
