"""The Flower app folder, TLS certificates and node keys, submitting a run, a loopback deployment.

- :func:`write_app`: the folder ``flwr run`` bundles: a ``pyproject.toml`` naming the app objects
  of :mod:`fedtail.flower.apps` and the run config keys, and a one-line module that imports them
  (fedtail itself is installed on every machine; the bundle carries no code of its own);
- :func:`make_tls`: a certificate authority and a SuperLink certificate signed by it (the
  ``cryptography`` package, which Flower depends on);
- :func:`make_node_key`: an ECDSA (P-384) key pair in OpenSSH format, what ``flower-supernode
  --auth-supernode-private-key`` and ``flwr supernode register`` read;
- :func:`submit`: ``flwr run`` of a fedtail config against a SuperLink, waiting for the run folder;
- :class:`LocalDeployment`: a SuperLink and N SuperNodes on 127.0.0.1 (``fedtail flower
  local``); every process it started is stopped on exit, also on Ctrl-C or failure.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtail.config import RunConfig
from fedtail.flower import FlowerError

APP_MODULE = "fedtail_flower_app"
# the run config keys of the app and their defaults (flwr run --run-config may only set declared keys)
RUN_CONFIG_DEFAULTS: dict[str, Any] = {"config": "", "out": "", "round-timeout": 0.0, "node-wait": 120.0, "resume": False}


def _bin(name: str) -> str:
    """A Flower executable of this Python environment (the SuperLink starts others by name: PATH has it)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def _env(home: Path) -> dict[str, str]:
    """The environment of a Flower process: its own Flower home, this environment's executables first."""
    env = dict(os.environ)
    env["FLWR_HOME"] = str(home)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# --- the app folder --------------------------------------------------------------------------------------


def write_app(folder: Path) -> Path:
    """Write the Flower app folder that ``flwr run FOLDER`` bundles; returns it."""
    from fedtail import __version__

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    defaults = "\n".join(f"{k} = {json.dumps(v)}" for k, v in RUN_CONFIG_DEFAULTS.items())
    (folder / "pyproject.toml").write_text(
        f"""# Written by fedtail {__version__} (fedtail.flower.deploy.write_app): the fedtail Flower app.
# fedtail must be installed (pip install "fedtail[flower]") wherever the SuperLink and SuperNodes run.
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "fedtail-app"
version = "{__version__}"
description = "Any fedtail algorithm on Flower: the simulator's round loop, client halves on SuperNodes"
license = "MIT"
dependencies = []

[tool.flwr.app]
publisher = "fedtail"

[tool.flwr.app.components]
serverapp = "{APP_MODULE}:server_app"
clientapp = "{APP_MODULE}:client_app"

[tool.flwr.app.config]
{defaults}
"""
    )
    (folder / f"{APP_MODULE}.py").write_text(
        '"""The fedtail Flower app: the objects live in the installed fedtail package."""\n\n'
        "from fedtail.flower import apps\n\n"
        "# assigned, not only imported: Flower checks the names in this file\n"
        "server_app = apps.server_app\n"
        "client_app = apps.client_app\n"
    )
    return folder


# --- certificates and keys ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_tls(folder: Path, hosts: list[str] = ("127.0.0.1", "localhost"), days: int = 30) -> TlsFiles:
    """A CA (``ca.crt``, ``ca.key``) and a SuperLink certificate for ``hosts`` (``server.pem``, ``server.key``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def key_pem(key: Any) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedtail flower CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    (folder / "ca.key").write_bytes(key_pem(ca_key))
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    files.server_key.write_bytes(key_pem(server_key))
    for private in (folder / "ca.key", files.server_key):
        private.chmod(0o600)
    return files


def make_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode key pair ``{name}`` (private, OpenSSH) and ``{name}.pub``; returns both paths."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    )
    return private, public


# --- submitting a run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Connection:
    """How the ``flwr`` command line reaches a SuperLink."""

    address: str  # host:port of the SuperLink
    root_certificates: Path | None = None  # the CA of the SuperLink's certificate; None: insecure

    def write_cli_home(self, home: Path, name: str = "fedtail") -> None:
        """``config.toml`` of a Flower home with this connection as the default one."""
        home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink]", f'default = "{name}"', "", f"[superlink.{name}]", f'address = "{self.address}"']
        if self.root_certificates is None:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{Path(self.root_certificates).resolve()}"')
        (home / "config.toml").write_text("\n".join(lines) + "\n")


def submit(
    connection: Connection,
    config: RunConfig,
    out: Path,
    work: Path,
    round_timeout: float | None = None,
    node_wait: float = 120.0,
    timeout: float | None = None,
    on_line=None,
    resume: bool = False,
) -> dict[str, Any]:
    """``flwr run`` the app with ``config`` into ``out`` (a path on the SuperLink's host); wait for its end.

    ``work`` holds the app folder, the run config file, the Flower home of the command line and
    ``run.log`` (the run's streamed log); ``resume``: the run continues from ``out``'s checkpoint.
    Returns ``summary.json``; a run that failed or ended
    without one raises :class:`FlowerError` with the reason (``FAILED``) and the log's tail.
    """
    import tomli_w

    work = Path(work)
    app = write_app(work / "app")
    home = work / "cli-home"
    connection.write_cli_home(home)
    run_config = {
        "config": config.model_dump_json(),
        "out": str(Path(out).resolve()),
        "round-timeout": float(round_timeout or 0.0),
        "node-wait": float(node_wait),
        "resume": bool(resume),  # continue from out/checkpoint.pt (fedtail.flower.server)
    }
    (work / "run-config.toml").write_text(tomli_w.dumps(run_config))
    for stale in ("summary.json", "FAILED"):
        (Path(out) / stale).unlink(missing_ok=True)
    command = [_bin("flwr"), "run", str(app), "fedtail", "--run-config", str(work / "run-config.toml"), "--stream"]
    log_path = work / "run.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=_env(home), cwd=os.getcwd(),
                                start_new_session=True)
        try:
            _wait_for_run(proc, Path(out), timeout)
        finally:
            stop_tree(proc.pid)
    summary_path, failed = Path(out) / "summary.json", Path(out) / "FAILED"
    if summary_path.exists():
        return json.loads(summary_path.read_text())
    reason = failed.read_text().strip() if failed.exists() else "the run ended without summary.json"
    raise FlowerError(f"the Flower run failed: {reason}\n--- {log_path} (last lines) ---\n{_tail(log_path)}")


def _wait_for_run(proc: subprocess.Popen, out: Path, timeout: float | None) -> None:
    """Until ``flwr run --stream`` ends, or the run folder shows the run ended (the stream may lag)."""
    start = time.monotonic()
    ended_at = None
    while proc.poll() is None:
        if ended_at is None and ((out / "summary.json").exists() or (out / "FAILED").exists()):
            ended_at = time.monotonic()
        if ended_at is not None and time.monotonic() - ended_at > 10:
            return  # the folder is complete; the log stream need not be waited for
        if timeout is not None and time.monotonic() - start > timeout:
            raise FlowerError(f"the Flower run did not end within {timeout:g} s")
        time.sleep(0.5)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# --- processes -------------------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc (Flower starts its helpers in new sessions: not in our group)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def become_subreaper() -> None:
    """Adopt orphaned descendants (Linux), so that the helpers Flower starts can be reaped when they end."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _is_flower(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().split(b"\0")
    except OSError:
        return False
    return any(Path(a.decode(errors="replace")).name.startswith(("flower-", "flwr-")) for a in args[:2])


def stop_tree(pid: int, grace: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Stop ``pid`` and its descendants: ``sig``, then SIGKILL after ``grace`` seconds; reap what is ours."""
    pids = process_tree(pid)
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        _reap(pids)
        time.sleep(0.1)
    for p in pids:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    while _reap(pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _reap(pids: list[int]) -> bool:
    """Reap those of ``pids`` that are our (or adopted) children and have ended; True if some are still to end."""
    waiting = False
    for p in pids:
        try:
            done, _ = os.waitpid(p, os.WNOHANG)
            waiting |= done == 0
        except ChildProcessError:
            pass
    return waiting


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, log: Path, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FlowerError(f"{what} exited with code {proc.returncode}\n--- {log} ---\n{_tail(log)}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise FlowerError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:g} s\n{_tail(log)}")


@dataclass
class Node:
    index: int
    port: int
    node_config: str
    key: Path | None = None
    proc: subprocess.Popen | None = None


@dataclass
class LocalDeployment:
    """A SuperLink and ``nodes`` SuperNodes on 127.0.0.1, with their files under ``folder``.

    Node k hosts the clients c with c mod nodes = k (``partition-id=k num-partitions=nodes``) and
    keeps their state in ``folder/node-k/state``. ``tls``: certificates in ``folder/tls`` and TLS on
    every connection to the SuperLink; ``auth``: node keys in ``folder/keys``, registered with the
    SuperLink, and node authentication on (with TLS, which Flower requires for it). Use as a context manager: leaving it stops every
    process it started.
    """

    folder: Path
    nodes: int
    tls: bool = False
    auth: bool = False
    data_dir: str | None = None
    port: int | None = None
    superlink: subprocess.Popen | None = None
    node_list: list[Node] = field(default_factory=list)
    tls_files: TlsFiles | None = None

    def __post_init__(self) -> None:
        self.folder = Path(self.folder).resolve()
        if self.nodes < 1:
            raise FlowerError(f"--nodes must be at least 1 (got {self.nodes})")
        self.tls = self.tls or self.auth  # Flower authenticates nodes only over TLS

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def connection(self) -> Connection:
        return Connection(self.address, self.tls_files.ca_cert if self.tls_files else None)

    def __enter__(self) -> "LocalDeployment":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        become_subreaper()
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.tls:
            self.tls_files = make_tls(self.folder / "tls")
        self.port = self.port or free_port()
        self._start_superlink()
        for k in range(self.nodes):
            state = self.folder / f"node-{k}" / "state"
            config = f'partition-id={k} num-partitions={self.nodes} state-dir="{state}"'
            if self.data_dir:
                config += f' data-dir="{Path(self.data_dir).resolve()}"'
            node = Node(k, free_port(), config)
            if self.auth:
                node.key, public = make_node_key(self.folder / "keys", f"node-{k}")
                self.register(public)
            self.node_list.append(node)
            self.start_node(k)

    def _start_superlink(self) -> None:
        command = [_bin("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
                   "--disable-runtime-dependency-installation"]  # fmt: skip
        if self.tls_files:
            t = self.tls_files
            command += ["--ssl-certfile", str(t.server_cert), "--ssl-keyfile", str(t.server_key),
                        "--ssl-ca-certfile", str(t.ca_cert)]  # fmt: skip
        else:
            command.append("--insecure")
        if self.auth:
            command.append("--enable-supernode-auth")
        log = self.folder / "superlink.log"
        self.superlink = self._spawn(command, log, self.folder / "superlink-home")
        _wait_port(self.port, self.superlink, log, "the SuperLink")

    def register(self, public_key: Path, connection: Connection | None = None) -> None:
        """``flwr supernode register`` a node's public key with the SuperLink (this one, or ``connection``)."""
        home = self.folder / "cli-home"
        (connection or self.connection).write_cli_home(home)
        result = subprocess.run(
            [_bin("flwr"), "supernode", "register", str(public_key), "fedtail"],
            env=_env(home), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if result.returncode != 0:
            raise FlowerError(f"flwr supernode register {public_key} failed:\n{result.stdout}\n{result.stderr}")

    def start_node(self, k: int, key: Path | None = None) -> subprocess.Popen:
        """Start (or restart) SuperNode ``k``; ``key`` overrides its private key (a wrong one, in tests)."""
        node = self.node_list[k]
        command = [_bin("flower-supernode"), "--superlink", self.address, "--host", "127.0.0.1",
                   "--port", str(node.port), "--node-config", node.node_config]  # fmt: skip
        command += ["--root-certificates", str(self.tls_files.ca_cert)] if self.tls_files else ["--insecure"]
        key = key or node.key
        if key is not None:
            command += ["--auth-supernode-private-key", str(key)]
        node.proc = self._spawn(command, self.folder / f"node-{k}.log", self.folder / f"node-{k}" / "home", append=True)
        return node.proc

    def kill_node(self, k: int) -> None:
        """SIGKILL SuperNode ``k`` and every process under it (a machine lost in the middle of a round)."""
        node = self.node_list[k]
        if node.proc is not None:
            stop_tree(node.proc.pid, grace=5.0, sig=signal.SIGKILL)
            node.proc = None

    def _spawn(self, command: list[str], log: Path, home: Path, append: bool = False) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        with open(log, "a" if append else "w") as fh:
            fh.write(f"$ {' '.join(command)}\n")
            fh.flush()
            return subprocess.Popen(command, stdout=fh, stderr=subprocess.STDOUT, env=_env(home), cwd=os.getcwd(),
                                    start_new_session=True)  # fmt: skip

    def stop(self) -> None:
        """Stop every SuperNode, then the SuperLink (with every process under them)."""
        for node in self.node_list:
            if node.proc is not None:
                stop_tree(node.proc.pid)
                node.proc = None
        if self.superlink is not None:
            stop_tree(self.superlink.pid)
            self.superlink = None
        # Flower helpers orphaned by a node that ended on its own (refused, killed) were adopted by
        # this process (become_subreaper): stop those too.
        for pid in process_tree(os.getpid())[1:]:
            if _is_flower(pid):
                stop_tree(pid)

    def pids(self) -> list[int]:
        """Every live process of the deployment (for checks that nothing is left)."""
        roots = [n.proc.pid for n in self.node_list if n.proc is not None]
        if self.superlink is not None:
            roots.append(self.superlink.pid)
        return [p for r in roots for p in process_tree(r) if _alive(p)]

    def run(self, config: RunConfig, out: Path, round_timeout: float | None = None, timeout: float | None = None,
            resume: bool = False) -> dict[str, Any]:
        """Submit ``config`` to this deployment and wait for its summary (``resume``: from ``out``'s checkpoint)."""
        return submit(self.connection, config, out, self.folder, round_timeout=round_timeout, timeout=timeout, resume=resume)
