"""What the engine does to updates on their way to the server and in the server's mean, for every
algorithm at once: hostile clients (``--byzantine``), robust aggregation (``--aggregate``) and
client-level differential privacy (``--dp-clip``).

On the client (:func:`outgoing`, called by the client runtime after the client half, so the same in
the simulator and on a Flower node): a fit's reply tensors that update a tensor the server sent are
*updates*, ``Δ = reply − sent``.

- **DP clipping** (DP-FedAvg, McMahan et al., ICLR 2018, Alg. 1 "ClipFn"): the client's whole update
  (every floating tensor it was sent and sends back, as one vector) is scaled to L2 norm at most C.
  A reply tensor it was not sent cannot be clipped: the run stops with an error naming it (an
  algorithm that uploads one does not declare itself DP-compatible, ``Algorithm.dp``). The clipped
  update is cast back to the reply's dtype, so its norm may pass C by float32 rounding (a relative
  few 10⁻⁶); the accounting takes 2C.
- **Hostile clients**: ``--byzantine K`` clients, drawn once from the seed (:func:`hostile`), send
  ``sent − Δ`` (``sign-flip``), ``sent + S·Δ`` (``scale:S``) or ``sent + N(0, S²)`` (``gaussian:S``,
  drawn from the task's seed) instead of ``sent + Δ``; a tensor the server did not send, and every
  upload of an algorithm whose replies are updates already (``Algorithm.uploads``: FedNova's d_i), is
  treated as an update of zeros. A hostile client corrupts what it sends after its own clipping. Its state
  (a personal model) stays honest: only the upload is corrupted.

On the server (:func:`server_aggregation`, around each round of the server half): the rule
(:mod:`fedtail.algorithms.aggregate`) and, under DP, Gaussian noise of standard deviation σ = z·C
on the sum of the n replies of each mean, which is then divided by n, unweighted.

**Accounting** (:func:`epsilon`): Google's dp-accounting RDP accountant (``pip install fedtail[dp]``).
The run samples m of the N clients uniformly without replacement each round (a public, fixed m),
so the privacy unit is one client's whole data under *replace-one* neighbouring: one client
replaced changes the sum of clipped updates by at most 2C, and the event is
``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z / 2))`` composed once per round (Wang,
Balle and Kasiviswanathan, AISTATS 2019, Thm. 27); with nested stage tasks the M rounds of one round
of global optimisation share their clients, so each draw is ``SampledWithoutReplacement(N, m,
SelfComposed(Gaussian(z / 2), M))``. Dropouts and replies rejected for reasons that do not depend
on the data only remove participants; the settings that would drop a client for what its data did
are refused under DP (``--on-nonfinite reject``, a ``--max-update-norm`` below the clip). With ``--dp-epsilon E`` the accountant's
``calibrate_dp_mechanism`` picks z so the run's rounds spend E at δ.

What ε covers: the sequence of noised means (the models the server computes), against anyone who
does not know what drew the sampled clients and the noise. In the simulator that is the run's seed
(the run is reproducible from it; ``summary.json`` ``privacy.randomness`` says so). A Flower
deployment sends the seed to every node, which needs it to cut its data, so there the server draws
a secret from the operating system at the run's start (``GridExecutor.privacy_secret``), keeps it in
its checkpoint only, and draws both from it: no node can subtract the noise or tell who else was
sampled. The round logs (which name the sampled clients) stay with the server; the per-round training losses, sample
counts and evaluation metrics in ``metrics.jsonl`` are released without noise, and integer buffers
(BatchNorm's ``num_batches_tracked``) are neither clipped nor noised. A non-finite update is not
clipped (its reply is rejected as non-finite by the engine's checks).
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch

from fedtail.algorithms.aggregate import Noise, Rule, aggregation
from fedtail.algorithms.base import Message
from fedtail.errors import ConfigError, FedtailError

if TYPE_CHECKING:
    from fedtail.algorithms.base import Algorithm
    from fedtail.config import RunConfig

HOSTILE_KEY, CORRUPT_KEY, NOISE_KEY = 0xB12, 0xB13, 0xD9  # derive_seed keys
# summary.json privacy.randomness: what drew the sampled clients and the noise (module docstring)
SECRET = "the server's secret, drawn from the operating system and never sent to the nodes"
FROM_SEED = "the run's seed (reproducible; the guarantee does not hold against whoever knows the seed)"


@dataclass(frozen=True)
class Corruption:
    """What a hostile client does to its update (module docstring)."""

    kind: str = "sign-flip"
    scale: float = 1.0

    @classmethod
    def parse(cls, text: str) -> "Corruption":
        spec = str(text).strip().lower()
        if spec == "sign-flip":
            return cls()
        found = re.fullmatch(r"(scale|gaussian):([0-9.eE+-]+)", spec)
        value = None
        if found:
            try:
                value = float(found.group(2))
            except ValueError:
                value = None
        if value is None or not math.isfinite(value) or (found.group(1) == "gaussian" and value <= 0):
            raise ValueError(f"--byzantine-mode takes sign-flip | scale:S | gaussian:S with S > 0 for gaussian (got {text!r})")
        return cls(found.group(1), value)

    def __str__(self) -> str:
        return self.kind if self.kind == "sign-flip" else f"{self.kind}:{self.scale:g}"

    def apply(self, sent: torch.Tensor | None, value: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        base = torch.zeros_like(value) if sent is None else sent.to(value.dtype)
        if self.kind == "gaussian":
            noise = torch.randn(value.shape, generator=generator, dtype=torch.float64)
            return base + (noise * self.scale).to(value.dtype)
        factor = -1.0 if self.kind == "sign-flip" else self.scale
        return base + (value - base) * factor


def hostile(config: RunConfig) -> frozenset[int]:
    """The ``--byzantine`` clients: a function of the seed only (simulator and Flower alike)."""
    from fedtail.engine.context import derive_seed

    k, n = config.faults.byzantine, config.partition.num_clients
    if k == 0:
        return frozenset()
    rng = np.random.default_rng(derive_seed(config.seed, HOSTILE_KEY))
    return frozenset(int(c) for c in rng.choice(n, size=k, replace=False))


def check(config: RunConfig, spec: Algorithm, server: bool = True) -> None:
    """ConfigError unless the algorithm takes the run's aggregation rule and DP setting; ``server``:
    also the accountant (installed, and a z for ``--dp-epsilon``), which a Flower node, clipping
    only, does without."""
    rule = Rule.parse(config.faults.aggregate)
    if rule.kind != "mean" and spec.robust is not True:
        raise ConfigError(f"--aggregate {rule}: {spec.name} {_why(spec.robust, 'a robust rule')}")
    if config.privacy.active and spec.dp is not True:
        raise ConfigError(f"--dp-clip: {spec.name} {_why(spec.dp, 'client-level DP')}")
    if config.privacy.active and server:
        _accountant()  # before any round: a run without the [dp] extra would fail at its first ε
        noise_multiplier(config)  # --dp-epsilon has a z


def _why(declared: bool | str, what: str) -> str:
    return f"cannot take {what}: {declared}" if isinstance(declared, str) else f"does not declare that it takes {what}"


def outgoing(config: RunConfig, cid: int, seed: int, sent: Message, reply: Message, guard: "ClientGuard") -> Message:
    """A fit's reply as the client sends it: clipped under DP, corrupted by a hostile client."""
    clip = config.privacy.clip
    if clip is None and cid not in guard.hostile:
        return reply
    tensors = dict(reply.tensors)
    floating = [k for k, v in tensors.items() if v.is_floating_point()]
    if clip is not None:
        unsent = [k for k in floating if k not in sent.tensors or sent.tensors[k].shape != tensors[k].shape]
        if unsent:
            raise FedtailError(
                f"--dp-clip: {config.algorithm}'s reply holds {unsent[0]!r}, which is not an update of a tensor the "
                "server sent, so it cannot be clipped"
            )
        deltas = {k: tensors[k].to(torch.float64) - sent.tensors[k].to(torch.float64) for k in floating}
        norm = math.sqrt(sum(float(d.square().sum()) for d in deltas.values()))
        factor = min(1.0, clip / norm) if 0 < norm < math.inf else 1.0  # NaN / inf: rejected downstream
        if factor < 1.0:
            for k in floating:
                tensors[k] = (sent.tensors[k].to(torch.float64) + deltas[k] * factor).to(tensors[k].dtype)
    if cid in guard.hostile:
        generator = torch.Generator().manual_seed(seed ^ CORRUPT_KEY)
        for k in floating:
            base = None if guard.updates else sent.tensors.get(k)  # an upload that is an update: of zero
            tensors[k] = guard.corruption.apply(base, tensors[k], generator)
    return Message(reply.kind, tensors, dict(reply.config), dict(reply.metrics))


@dataclass(frozen=True)
class ClientGuard:
    """What :func:`outgoing` needs of the run, built once per client runtime."""

    hostile: frozenset[int]
    corruption: Corruption
    updates: bool = False  # the algorithm's replies carry updates, not models (Algorithm.uploads)

    @classmethod
    def of(cls, config: RunConfig) -> "ClientGuard":
        from fedtail import components

        updates = components.algorithm(config.algorithm).uploads == "updates"
        return cls(hostile(config), Corruption.parse(config.faults.byzantine_mode), updates)


# --- the server's side -------------------------------------------------------------------------


@contextlib.contextmanager
def server_aggregation(config: RunConfig, rnd: int, seed: int | None = None) -> Iterator[None]:
    """The run's rule and DP noise for the means of round ``rnd``: noise drawn from (``seed``, round),
    ``seed`` the run's seed or the server's secret (module docstring)."""
    from fedtail.engine.context import derive_seed

    rule = Rule.parse(config.faults.aggregate)
    noise = None
    if config.privacy.active:
        std = noise_multiplier(config) * float(config.privacy.clip)
        key = config.seed if seed is None else seed
        noise = Noise(std, torch.Generator().manual_seed(derive_seed(key, NOISE_KEY, rnd)))
    if rule.kind == "mean" and noise is None:
        yield
        return
    with aggregation(rule, noise):
        yield


# --- accounting --------------------------------------------------------------------------------


def _accountant() -> Any:
    try:
        import dp_accounting
        from dp_accounting import rdp
    except ImportError:
        raise ConfigError("--dp-clip needs Google's dp-accounting: pip install 'fedtail[dp]'") from None
    return dp_accounting, rdp


def _event(n: int, m: int, z: float, k: int = 1) -> Any:
    """One draw of m of n clients whose sum of clipped updates is noised ``k`` times (k rounds of one
    round of global optimisation with nested stages: the same clients in each)."""
    dp_accounting, _ = _accountant()
    gaussian = dp_accounting.GaussianDpEvent(z / 2)
    return dp_accounting.SampledWithoutReplacementDpEvent(n, m, gaussian if k == 1 else dp_accounting.SelfComposedDpEvent(gaussian, k))


def _draws(config: RunConfig, rounds: int) -> list[tuple[int, int]]:
    """(k, count): the client draws of the first ``rounds`` rounds, each released k times. A client
    draw is a round's (``sample_clients`` of its round of global optimisation): with nested stages
    the M rounds of one round of global optimisation share it."""
    plan = config.plan
    per = plan.num_stages if plan.has_stages and plan.schedule == "nested" else 1
    full, rest = divmod(rounds, per)
    return [(k, c) for k, c in ((per, full), (rest, 1 if rest else 0)) if c]


@functools.lru_cache(maxsize=64)
def _draw_rdp(n: int, m: int, z: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The accountant's RDP orders and the RDP of one draw at each (composition adds them up, so the
    curve of ε over rounds costs one accountant computation per kind of draw)."""
    dp_accounting, rdp = _accountant()
    accountant = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(_event(n, m, z, k), 1)
    return np.asarray(accountant._orders, dtype=float), np.asarray(accountant._rdp, dtype=float)


def _epsilon(config: RunConfig, z: float, rounds: int) -> float:
    _, rdp = _accountant()
    n, m = config.partition.num_clients, config.clients_per_round
    total, orders = 0.0, None
    for k, count in _draws(config, rounds):
        orders, per_draw = _draw_rdp(n, m, z, k)
        total = total + per_draw * count
    if orders is None:
        return 0.0
    return float(rdp.rdp_privacy_accountant.compute_epsilon(orders, total, config.privacy.delta)[0])


@functools.lru_cache(maxsize=64)
def _calibrate(n: int, m: int, draws: tuple[tuple[int, int], ...], epsilon: float, delta: float) -> float:
    dp_accounting, rdp = _accountant()

    def fresh() -> Any:
        return rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)

    def event(z: float) -> Any:
        return dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(_event(n, m, z, k), c) for k, c in draws])

    try:
        bracket = dp_accounting.LowerEndpointAndGuess(0.05, 2.0)  # z = 0 would divide by zero
        return float(dp_accounting.calibrate_dp_mechanism(fresh, event, epsilon, delta, bracket_interval=bracket, tol=1e-3))
    except Exception as err:  # the accountant's bracket search failed: say so with the setting
        raise ConfigError(f"--dp-epsilon {epsilon}: no noise multiplier found for {sum(c for _, c in draws)} client draws ({err})") from None


def noise_multiplier(config: RunConfig) -> float:
    """z: ``--dp-noise``, or the one ``--dp-epsilon`` asks for over the run's rounds."""
    p = config.privacy
    if p.noise is not None:
        return float(p.noise)
    assert p.epsilon is not None
    n, m = config.partition.num_clients, config.clients_per_round
    return _calibrate(n, m, tuple(_draws(config, config.rounds)), p.epsilon, p.delta)


def epsilon(config: RunConfig, rounds: int) -> float:
    """ε spent after ``rounds`` rounds at the run's δ (inf when z = 0)."""
    z = noise_multiplier(config)
    if z == 0:
        return math.inf
    return _epsilon(config, z, rounds)


def run_summary(config: RunConfig, rounds: int, secret: bool = False) -> dict[str, Any]:
    """What ``summary.json`` adds: ``privacy`` under DP, ``byzantine`` (the hostile clients) with them;
    ``secret``: the sampling and the noise came from the server's secret, not from the run's seed."""
    out: dict[str, Any] = {}
    if config.faults.byzantine:
        out["byzantine"] = {"clients": sorted(hostile(config)), "mode": config.faults.byzantine_mode}
    if config.privacy.active:
        eps = epsilon(config, rounds)
        out["privacy"] = {
            "epsilon": eps if math.isfinite(eps) else None,
            "delta": config.privacy.delta,
            "noise_multiplier": noise_multiplier(config),
            "clip": config.privacy.clip,
            "rounds": rounds,
            "sampling": f"{config.clients_per_round} of {config.partition.num_clients} clients a round, uniformly without replacement",
            "accountant": "dp-accounting RDP, replace-one neighbouring, SampledWithoutReplacement(N, m, Gaussian(z/2))",
            "randomness": SECRET if secret else FROM_SEED,
        }
    return out
