"""In-process Flower grids for tests that kill the ServerApp's host (fedtail.flower.inprocess)."""

from __future__ import annotations

from fedtail.flower.inprocess import InProcessGrid


class DyingGrid(InProcessGrid):
    """A grid whose ServerApp's host dies in round ``die_in``, once the first node of its first training push ran its tasks."""

    def __init__(self, *args, die_in: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.die_in = die_in

    def push_messages(self, messages):
        messages = list(messages)
        if messages and messages[0].metadata.message_type.startswith("train") and messages[0].metadata.group_id == str(self.die_in):
            super().push_messages(messages[:1])
            raise RuntimeError("the ServerApp's host died")
        return super().push_messages(messages)
