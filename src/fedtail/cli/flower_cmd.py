"""``fedtail flower ...``: runs on Flower (a loopback deployment, or a SuperLink elsewhere), certificates, keys.

``local`` and ``run`` take every flag of ``fedtail run`` (the same parameters, copied from its
signature, so the two never drift apart) plus the deployment's own.
"""

from __future__ import annotations

import inspect
import signal
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from fedtail.errors import FedtailError, RunDiverged

flower_app = typer.Typer(
    no_args_is_help=True,
    help="Run any algorithm across machines on Flower (needs pip install -e \".\\[flower]\").",
)


def _run_parameters() -> tuple[list[inspect.Parameter], dict[str, Any]]:
    """The parameters (typer options) of ``fedtail run``, --resume included (the ServerApp resumes from
    the run folder's checkpoint, the nodes bring their clients' states back to it)."""
    from fedtail.cli.main import run

    hints = typing.get_type_hints(run)
    params = [p.replace(annotation=hints[p.name]) for p in inspect.signature(run).parameters.values()]
    return params, {p.name: hints[p.name] for p in params}


def _with_run_options(extra: list[inspect.Parameter]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command ``fedtail run``'s options plus ``extra``; it is called with keyword arguments."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        params, hints = _run_parameters()

        def command(**kwargs: Any) -> None:
            func(**kwargs)

        command.__name__ = func.__name__
        command.__doc__ = func.__doc__
        command.__signature__ = inspect.Signature(params + extra)  # type: ignore[attr-defined]
        command.__annotations__ = hints | {p.name: p.annotation for p in extra}
        return command

    return decorate


def _option(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _config(kwargs: dict[str, Any]):
    """The run's validated config, as ``fedtail run`` builds it, and whether it resumes from --out's
    checkpoint (``fedtail run``'s rules: --resume takes --out's config.json, a checkpoint of the same
    config is resumed without it too, one of another config is refused); refuses a finished run."""
    from fedtail.cli.main import resolve_run

    config, found = resolve_run(kwargs)
    if found is not None:
        typer.echo(f"resuming {kwargs['out']} from its checkpoint after round {found[0]['round']}", err=True)
    return config, found is not None


def _terminate_as_interrupt() -> None:
    """SIGTERM ends a command like Ctrl-C does, so that every process it started is stopped."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _finish(summary: dict[str, Any], out: Path) -> None:
    from rich.console import Console

    from fedtail.cli.main import print_summary

    print_summary(summary, out)
    wire = summary.get("bytes", {})
    if "wire_down" in wire:
        Console().print(f"Flower sent {wire['wire_down']:,} bytes down and {wire['wire_up']:,} up (serialised messages)")


def _handle(action: Callable[[], tuple[dict[str, Any], Path]]) -> None:
    from fedtail.cli.main import EXIT_DIVERGED, console, fail

    try:
        summary, out = action()
    except FedtailError as err:
        fail(str(err))
    except RunDiverged as err:
        fail(str(err), EXIT_DIVERGED)
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: every Flower process this command started was stopped")
        raise typer.Exit(130)
    _finish(summary, out)


LOCAL_OPTIONS = [
    _option("nodes", int, typer.Option(..., "--nodes", help="SuperNodes to start; node k hosts clients c with c mod N = k")),
    _option("tls", bool, typer.Option(False, "--tls", help="generate a CA and certificates into OUT/flower/tls; TLS on")),
    _option("auth", bool, typer.Option(False, "--auth", help="generate node keys into OUT/flower/keys; node authentication on (and TLS, which it needs)")),
    _option("round_timeout", Optional[float], typer.Option(
        None, "--round-timeout", help="seconds to wait for one exchange's answers; a node that has not answered is a missing reply")),
    _option("port", Optional[int], typer.Option(None, "--port", help="the SuperLink's port on 127.0.0.1 (default: a free one)")),
]  # fmt: skip


@flower_app.command("local")
@_with_run_options(LOCAL_OPTIONS)
def local(**kwargs: Any) -> None:
    """Start a SuperLink and --nodes SuperNodes on 127.0.0.1, run, write the run folder, stop them all."""

    def action() -> tuple[dict[str, Any], Path]:
        from fedtail.flower import require_flwr
        from fedtail.flower.deploy import LocalDeployment

        require_flwr()
        config, resume = _config(kwargs)
        out: Path = kwargs["out"]
        if kwargs["nodes"] > config.partition.num_clients:
            raise FedtailError(
                f"--nodes {kwargs['nodes']} exceeds the {config.partition.num_clients} clients: a node would host none"
            )
        if kwargs["round_timeout"] is not None and kwargs["round_timeout"] <= 0:
            raise FedtailError(f"--round-timeout must be > 0 seconds (got {kwargs['round_timeout']})")
        _terminate_as_interrupt()
        out.mkdir(parents=True, exist_ok=True)
        deployment = LocalDeployment(
            out / "flower", kwargs["nodes"], tls=kwargs["tls"], auth=kwargs["auth"], data_dir=config.data_dir,
            port=kwargs["port"],
        )  # fmt: skip
        with deployment:
            typer.echo(
                f"Flower: SuperLink on {deployment.address}, {kwargs['nodes']} SuperNodes"
                f"{', TLS' if deployment.tls else ''}{', node authentication' if kwargs['auth'] else ''}; "
                f"logs in {out / 'flower'}",
                err=True,
            )
            summary = deployment.run(config, out, round_timeout=kwargs["round_timeout"], resume=resume)
        return summary, out

    _handle(action)


RUN_OPTIONS = [
    _option("superlink", str, typer.Option(..., "--superlink", help="the SuperLink's address HOST:PORT")),
    _option("root_certificates", Optional[Path], typer.Option(
        None, "--root-certificates", help="CA certificate of the SuperLink (TLS); without it: --insecure")),
    _option("insecure", bool, typer.Option(False, "--insecure", help="connect without TLS")),
    _option("round_timeout", Optional[float], typer.Option(
        None, "--round-timeout", help="seconds to wait for one exchange's answers; a node that has not answered is a missing reply")),
    _option("node_wait", float, typer.Option(120.0, "--node-wait", help="seconds to wait at the start for nodes hosting every client")),
]  # fmt: skip


@flower_app.command("run")
@_with_run_options(RUN_OPTIONS)
def run_on(**kwargs: Any) -> None:
    """Submit a run to a running SuperLink (SuperNodes elsewhere); --out is a folder on the SuperLink's host."""

    def action() -> tuple[dict[str, Any], Path]:
        from fedtail.flower import require_flwr
        from fedtail.flower.deploy import Connection, submit

        require_flwr()
        if (kwargs["root_certificates"] is None) == (not kwargs["insecure"]):
            raise FedtailError("give --root-certificates CA.crt (TLS) or --insecure, not both and not neither")
        config, resume = _config(kwargs)
        out: Path = kwargs["out"]
        out.mkdir(parents=True, exist_ok=True)
        _terminate_as_interrupt()
        connection = Connection(kwargs["superlink"], kwargs["root_certificates"])
        summary = submit(connection, config, out, out / "flower", round_timeout=kwargs["round_timeout"],
                         node_wait=kwargs["node_wait"], resume=resume)  # fmt: skip
        return summary, out

    _handle(action)


@flower_app.command("tls")
def tls(
    out: Path = typer.Option(..., "--out", help="folder for ca.crt, ca.key, server.pem, server.key"),
    host: list[str] = typer.Option([], "--host", help="a name or IP the SuperNodes use for the SuperLink (repeat; 127.0.0.1 and localhost are added)"),
    days: int = typer.Option(365, help="validity in days"),
) -> None:
    """A CA and a SuperLink certificate for --host (give every name the SuperNodes use to reach it)."""
    from fedtail.flower.deploy import make_tls

    hosts = list(dict.fromkeys([*host, "127.0.0.1", "localhost"]))  # the SuperLink's own helpers connect locally
    files = make_tls(out, hosts, days)
    typer.echo(f"CA {files.ca_cert} (give it to the SuperNodes), SuperLink {files.server_cert} + {files.server_key}")


@flower_app.command("node-key")
def node_key(
    out: Path = typer.Option(..., "--out", help="folder for the key pair"),
    name: str = typer.Option("supernode", help="file name of the private key (the public key adds .pub)"),
) -> None:
    """A SuperNode key pair (ECDSA P-384, OpenSSH): register NAME.pub, start the node with NAME."""
    from fedtail.flower.deploy import make_node_key

    private, public = make_node_key(out, name)
    typer.echo(f"private key {private} (stays on the SuperNode), public key {public} (flwr supernode register)")


@flower_app.command("register")
def register(
    public_key: Path = typer.Argument(..., help="a SuperNode's public key (NAME.pub of fedtail flower node-key)"),
    superlink: str = typer.Option(..., "--superlink", help="the SuperLink's address HOST:PORT"),
    root_certificates: Path = typer.Option(..., "--root-certificates", help="CA certificate of the SuperLink"),
) -> None:
    """Register a SuperNode's public key with a SuperLink started with --enable-supernode-auth."""
    import tempfile

    from fedtail.cli.main import fail
    from fedtail.flower.deploy import Connection, LocalDeployment

    with tempfile.TemporaryDirectory() as home:
        deployment = LocalDeployment(Path(home), 1)  # only its `register` (flwr supernode register) is used
        deployment.port = None
        try:
            deployment.register(public_key, Connection(superlink, root_certificates))
        except FedtailError as err:
            fail(str(err))
    typer.echo(f"registered {public_key} with {superlink}")


@flower_app.command("app")
def app_folder(out: Path = typer.Option(..., "--out", help="folder to write the Flower app into")) -> None:
    """Write the Flower app folder (pyproject.toml + module), for `flwr run` by hand."""
    from fedtail.flower.deploy import write_app

    typer.echo(f"Flower app written to {write_app(out)}")
