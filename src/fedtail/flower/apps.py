"""The Flower app objects: ``server_app`` (a ``ServerApp``) and ``client_app`` (a ``ClientApp``).

Flower loads them by the references in the app folder's ``pyproject.toml``
(:func:`fedtail.flower.deploy.write_app`). The run config of the app (``flwr run --run-config``)
carries the run's fedtail config as JSON (``config``), the run folder on the SuperLink's host
(``out``), the deployment's waits (``round-timeout``, ``node-wait``) and whether the run continues
from the folder's checkpoint (``resume``).
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedtail.flower import node, server

server_app = ServerApp()
client_app = ClientApp()


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    server.serve(grid, context.run_config, context.run_id)


@client_app.query("hello")
def _hello(msg: Message, context: Context) -> Message:
    answer = node.hello(context.run_config, context.node_config)
    return Message(RecordDict({"hello": ConfigRecord(answer)}), reply_to=msg)


@client_app.train("tasks")
def _train(msg: Message, context: Context) -> Message:
    return Message(node.run_tasks(msg.content, context.run_config, context.node_config), reply_to=msg)


@client_app.evaluate("tasks")
def _evaluate(msg: Message, context: Context) -> Message:
    return Message(node.run_tasks(msg.content, context.run_config, context.node_config), reply_to=msg)
