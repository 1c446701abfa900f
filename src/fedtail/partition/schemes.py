"""Partition schemes: cut the long-tailed pool of training indices into client lists.

Every function takes `labels` (the whole train split), `kept` (indices retained by the long-tail cut),
C, the config and a numpy Generator, and never uses an index twice across clients.

Design choices (documented defaults):

- pathological: client i holds classes (i·n + j) mod C, j < n = --classes-per-client (the rotation
  of FedAvg-style label skew, simpler than sorting into shards and with no duplicate classes per
  client); each class's samples are shuffled and split evenly among the clients holding it, so with
  N·n >= C the whole pool is used. With --quantity, client i asks for n_i ~ U[MIN, MAX] samples split
  evenly over its n classes; a shortfall in one class is made up from its other classes.
- dominant (FedReMa): group g has labels (g·C//G + j) mod C, j < C//G + 1; client i is in group
  i mod G. First every client draws round(s·n) samples uniformly from the whole remaining pool, then
  n − round(s·n) uniformly from the remaining samples of its group's labels. FedReMa splits each
  client's 600 samples 80/20 into train/test; here --samples-per-client counts training samples only and
  the local test set comes from the local-test rule (sampled from the official test split by default).
- stages (GLDP's [N, S, M]): see `stages`.
"""

from __future__ import annotations

import numpy as np

from fedtail.errors import ConfigError
from fedtail.partition.config import PartitionConfig

SCHEMES: dict[str, str] = {
    "iid": "shuffle the (long-tailed) pool and split it into equal client shares",
    "dirichlet": "per class, client proportions p ~ Dir(alpha); --quantity / --balanced size variants",
    "pathological": "client i holds --classes-per-client classes (i*n+j) mod C, each class split evenly",
    "dominant": "FedReMa: clients in --groups groups with overlapping dominant labels plus --iid-fraction IID",
    "stages": "GLDP [N,S,M]: --stages sequential tasks of --classes-per-stage classes per client",
    "natural": "the data's own clients (client ids of an npz: or folder: dataset); --clients must equal their number",
}

# Bounded Dirichlet redraws: enough for any feasible setting, short enough to fail fast on infeasible ones.
MAX_DIRICHLET_TRIES = 1000

ClientLists = list[np.ndarray]
# A client's stages: (sorted class ids, train indices) per stage, in training order.
StageLists = list[list[tuple[np.ndarray, np.ndarray]]]


def _by_class(labels: np.ndarray, kept: np.ndarray, num_classes: int) -> list[np.ndarray]:
    kept_labels = labels[kept]
    return [kept[kept_labels == c] for c in range(num_classes)]


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, dtype=np.int64)


def _dirichlet(rng: np.random.Generator, alpha: float, size: int) -> np.ndarray:
    p = rng.dirichlet(np.full(size, alpha))
    if not np.all(np.isfinite(p)) or p.sum() <= 0:
        # Extremely small alpha can underflow every component; the limit is a one-hot vector.
        p = np.zeros(size)
        p[rng.integers(size)] = 1.0
    return p


def _split_evenly(rng: np.random.Generator, idx: np.ndarray, holders: list[int],
                  out: list[list[np.ndarray]]) -> None:
    """Shuffle one class's indices and share them evenly among `holders` (client order)."""
    if not holders:
        return
    for client, part in zip(holders, np.array_split(rng.permutation(idx), len(holders))):
        out[client].append(part)


def iid(labels: np.ndarray, kept: np.ndarray, num_classes: int, cfg: PartitionConfig,
        rng: np.random.Generator) -> ClientLists:
    """Shuffle the pool and cut it into N near-equal parts."""
    return [p.astype(np.int64) for p in np.array_split(rng.permutation(kept), cfg.num_clients)]


def dirichlet(labels: np.ndarray, kept: np.ndarray, num_classes: int, cfg: PartitionConfig,
              rng: np.random.Generator) -> ClientLists:
    """Per-class Dirichlet split with redraws until every client has >= --min-samples samples."""
    if cfg.quantity is not None:
        return _dirichlet_quantity(labels, kept, num_classes, cfg, rng)
    n = cfg.num_clients
    need = max(cfg.min_samples, 1)  # an empty client is never acceptable
    if need * n > len(kept):
        raise ConfigError(
            f"--min-samples {cfg.min_samples} × --clients {n} exceeds the {len(kept)} training samples "
            "kept after the long-tail cut; lower --min-samples or --clients, or use a smaller --imbalance")
    pools = _by_class(labels, kept, num_classes)
    for _ in range(MAX_DIRICHLET_TRIES):
        # Only the cut points are drawn per try: index lists are built once a draw is accepted.
        cuts = []
        sizes = np.zeros(n, dtype=np.int64)
        for pool in pools:
            p = _dirichlet(rng, cfg.alpha, n)
            c = (np.cumsum(p)[:-1] * len(pool)).astype(np.int64)
            cuts.append(c)
            sizes += np.diff(np.concatenate(([0], c, [len(pool)])))
        if sizes.min() >= need:
            break
    else:
        raise ConfigError(
            f"the Dirichlet partition left some client with fewer than {need} training samples in "
            f"{MAX_DIRICHLET_TRIES} draws; use a larger --alpha, fewer --clients or a smaller --min-samples")
    out: list[list[np.ndarray]] = [[] for _ in range(n)]
    for pool, c in zip(pools, cuts):
        for client, part in enumerate(np.split(rng.permutation(pool), c)):
            out[client].append(part)
    clients = [_concat(parts) for parts in out]
    if cfg.balanced:
        # CReFF: concatenate the client lists in client order and re-cut them into equal sizes.
        clients = [p.astype(np.int64) for p in np.array_split(_concat(clients), n)]
    return clients


def _dirichlet_quantity(labels: np.ndarray, kept: np.ndarray, num_classes: int, cfg: PartitionConfig,
                        rng: np.random.Generator) -> ClientLists:
    """Client sizes n_i ~ U[MIN, MAX], class mix q_i ~ Dir(alpha), sampled without replacement."""
    assert cfg.quantity is not None
    lo, hi = cfg.quantity
    sizes = rng.integers(lo, hi + 1, size=cfg.num_clients)
    if sizes.sum() > len(kept):
        raise ConfigError(
            f"--quantity {lo} {hi} drew {int(sizes.sum())} training samples in total for {cfg.num_clients} "
            f"clients but only {len(kept)} are kept after the long-tail cut; lower --quantity or "
            "--clients, or use a smaller --imbalance")
    pools = [rng.permutation(p) for p in _by_class(labels, kept, num_classes)]
    left = np.array([len(p) for p in pools], dtype=np.int64)
    clients = []
    for size in sizes:
        q = _dirichlet(rng, cfg.alpha, num_classes)
        take = np.zeros(num_classes, dtype=np.int64)
        need = int(size)
        while need > 0:
            avail = left - take
            w = np.where(avail > 0, q, 0.0)
            if w.sum() <= 0:
                # All of this client's preferred classes ran out: spread over whatever remains.
                w = (avail > 0).astype(float)
            draw = np.minimum(rng.multinomial(need, w / w.sum()), avail)
            take += draw
            need -= int(draw.sum())
        parts = []
        for c in np.flatnonzero(take):
            start = len(pools[c]) - left[c]
            parts.append(pools[c][start:start + take[c]])
        left -= take
        clients.append(_concat(parts))
    return clients


def pathological(labels: np.ndarray, kept: np.ndarray, num_classes: int, cfg: PartitionConfig,
                 rng: np.random.Generator) -> ClientLists:
    """Client i holds classes (i·n + j) mod C; see the module docstring."""
    n, k = cfg.num_clients, cfg.classes_per_client
    client_classes = [[(i * k + j) % num_classes for j in range(k)] for i in range(n)]
    pools = _by_class(labels, kept, num_classes)
    if cfg.quantity is None:
        holders: list[list[int]] = [[] for _ in range(num_classes)]
        for i, cls in enumerate(client_classes):
            for c in cls:
                holders[c].append(i)
        out: list[list[np.ndarray]] = [[] for _ in range(n)]
        for c in range(num_classes):
            _split_evenly(rng, pools[c], holders[c], out)
        return [_concat(parts) for parts in out]

    lo, hi = cfg.quantity
    sizes = rng.integers(lo, hi + 1, size=n)
    pools = [rng.permutation(p) for p in pools]
    left = np.array([len(p) for p in pools], dtype=np.int64)
    clients = []
    for i, (size, cls) in enumerate(zip(sizes, client_classes)):
        cls_arr = np.array(cls)
        want = np.full(k, size // k, dtype=np.int64)
        want[: size % k] += 1
        take = np.minimum(want, left[cls_arr])
        short = int(size - take.sum())
        # Make up a class's shortfall from the client's other classes, one sample at a time round-robin.
        while short > 0:
            room = np.flatnonzero(left[cls_arr] - take > 0)
            if len(room) == 0:
                raise ConfigError(
                    f"--quantity {lo} {hi}: client {i} needs {int(size)} samples of classes {cls} but "
                    f"they ran out; lower --quantity or --clients, raise --classes-per-client, "
                    "or use a smaller --imbalance")
            for j in room[:short]:
                take[j] += 1
            short = int(size - take.sum())
        parts = []
        for c, t in zip(cls_arr, take):
            start = len(pools[c]) - left[c]
            parts.append(pools[c][start:start + t])
            left[c] -= t
        clients.append(_concat(parts))
    return clients


def dominant_label_sets(num_classes: int, groups: int) -> list[list[int]]:
    """FedReMa groups: [[0,1,2],[2,3,4],[4,5,6],[6,7,8],[8,9,0]] for C=10, 5 groups."""
    width = min(num_classes // groups + 1, num_classes)
    return [[(g * num_classes // groups + j) % num_classes for j in range(width)] for g in range(groups)]


def dominant(labels: np.ndarray, kept: np.ndarray, num_classes: int, cfg: PartitionConfig,
             rng: np.random.Generator) -> ClientLists:
    """FedReMa's dominant-label groups with an --iid-fraction share of IID samples."""
    n, per = cfg.num_clients, cfg.samples_per_client
    if n * per > len(kept):
        raise ConfigError(
            f"--samples-per-client {per} × --clients {n} exceeds the {len(kept)} training samples kept "
            "after the long-tail cut; lower --samples-per-client or --clients, or use a smaller --imbalance")
    n_iid = int(np.floor(cfg.iid_fraction * per + 0.5))
    sets = dominant_label_sets(num_classes, cfg.groups)
    kept_labels = labels[kept]
    free = np.ones(len(kept), dtype=bool)
    iid_parts = []
    # IID shares first, for all clients, so group draws cannot starve a later client's IID share.
    for _ in range(n):
        pick = rng.choice(np.flatnonzero(free), size=n_iid, replace=False)
        free[pick] = False
        iid_parts.append(pick)
    clients = []
    for i in range(n):
        group = sets[i % cfg.groups]
        cand = np.flatnonzero(free & np.isin(kept_labels, group))
        if len(cand) < per - n_iid:
            raise ConfigError(
                f"client {i} needs {per - n_iid} samples of its dominant labels {group} but only "
                f"{len(cand)} remain; lower --samples-per-client or --clients, raise --iid-fraction, "
                "or use a smaller --imbalance")
        pick = rng.choice(cand, size=per - n_iid, replace=False)
        free[pick] = False
        clients.append(np.sort(kept[np.concatenate((iid_parts[i], pick))]).astype(np.int64))
    return clients


def stages(labels: np.ndarray, kept: np.ndarray, num_classes: int, cfg: PartitionConfig,
           rng: np.random.Generator) -> StageLists:
    """GLDP's [N, S, M]: M sequential stage tasks of S classes per client.

    Reading of sthfl-gldp.txt (Sec. 5.1): N clients, each with M stage tasks of S classes, drawn
    from a long-tailed (IF 10/50/100) training set; a client trains only on its current stage and is
    tested on all stages seen so far (the engine's job). Classes of different stages of one client are
    disjoint, so S·M <= C. Class assignment: one seeded random class order π, client i holds
    π[(i·S·M + j) mod C], j < S·M (every class is held once N·S·M >= C, each by floor or ceil of
    N·S·M/C clients); a per-client seeded shuffle of those classes gives the stage order, stage k =
    the next S. A class's kept samples are shuffled and split evenly among the clients holding it, so
    no index is used twice; unlike GLDP (equal client sizes), sizes then follow the long tail.
    """
    n, s, m = cfg.num_clients, cfg.classes_per_stage, cfg.stages
    per_client = s * m
    order = rng.permutation(num_classes)
    client_classes = [rng.permutation(order[(i * per_client + np.arange(per_client)) % num_classes])
                      for i in range(n)]
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    for i, cls in enumerate(client_classes):
        for c in cls:
            holders[int(c)].append(i)
    pools = _by_class(labels, kept, num_classes)
    share: list[dict[int, np.ndarray]] = [{} for _ in range(n)]
    for c in range(num_classes):
        if holders[c]:
            for client, part in zip(holders[c], np.array_split(rng.permutation(pools[c]), len(holders[c]))):
                share[client][c] = part.astype(np.int64)
    out: StageLists = []
    for i, cls in enumerate(client_classes):
        client_stages = []
        for k in range(m):
            stage_cls = np.sort(cls[k * s:(k + 1) * s]).astype(np.int64)
            client_stages.append((stage_cls, _concat([share[i][int(c)] for c in stage_cls])))
        out.append(client_stages)
    return out


def natural(clients: np.ndarray, kept: np.ndarray, num_clients: int) -> ClientLists:
    """The kept training rows of each of the data's own clients (ids 0..K−1), in id order."""
    found = int(clients.max()) + 1 if len(clients) else 0
    if found != num_clients:
        raise ConfigError(
            f"--partition natural: the data has {found} clients; pass --clients {found} (got {num_clients})")
    owner = clients[kept]
    return [np.sort(kept[owner == c]).astype(np.int64) for c in range(num_clients)]
