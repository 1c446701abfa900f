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
- semantic (MuPFL's segmentation split, Sec. 4.1: "each subset maintains β semantic classes and sets
  other classes as background"): pathological over the images' primary classes with n = β, and
  client i's labelling keeps its classes (i·β + j) mod C (`semantic_classes`); the engine maps
  every other class of its masks to the dataset's background. Segmentation datasets only.
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
    "stages": "GLDP [N,S,M]: --stages sequential tasks of --classes-per-stage classes per client (classes may "
              "recur; --balanced: equal-size label shards)",
    "natural": "the data's own clients (client ids of an npz: or folder: dataset); as many as the data holds (--clients, if given, must equal that)",
    "semantic": "MuPFL segmentation: pathological over the images' primary classes; client i keeps classes (i*n+j) mod C (n = --classes-per-client) and every other class becomes background",
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


def semantic_classes(client: int, num_classes: int, cfg: PartitionConfig) -> np.ndarray:
    """The classes ``--partition semantic`` keeps in client ``client``'s labelling: its pathological classes."""
    k = cfg.classes_per_client
    return np.array(sorted({(client * k + j) % num_classes for j in range(k)}), dtype=np.int64)


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


def distinct_rows(keys: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Exchange entries of ``keys`` (rows × width, small non-negative ints) between rows until no
    exchange lowers the number of repeated pairs Σ_rows Σ_keys C(n_key, 2); returns the
    permutation (row-major indices into ``keys``).

    Without a key of more entries than there are rows this ends with no row repeating a key;
    with one (a head class's shards), its entries end spread as evenly as the rows allow. Each
    step takes a random row with a repeat, the first of its repeated keys (in random order) that
    some exchange improves, and the exchange with the largest decrease (ties at random), so the
    count falls at every step and the loop ends when no row can improve.
    """
    rows, width = keys.shape
    perm = np.arange(keys.size).reshape(rows, width)
    table = keys.copy()
    n = np.zeros((rows, int(keys.max(initial=0)) + 1), dtype=np.int64)
    np.add.at(n, (np.repeat(np.arange(rows), width), table.reshape(-1)), 1)
    every = np.arange(rows)[:, None]
    while True:
        repeated = np.flatnonzero((n > 1).any(axis=1))
        moved = False
        for r in rng.permutation(repeated):
            for c in rng.permutation(np.flatnonzero(n[r] > 1)):  # none left if this pass mended it
                # change of the count when row r gives one c for entry (r2, q) of key k
                delta = -(n[r, c] - 1) + n[r][table] - (n[every, table] - 1) + n[:, c][:, None]
                delta[table == c] = 0
                if delta.min() < 0:
                    break
            else:
                continue
            best = delta.min()
            r2, q = divmod(int(rng.choice(np.flatnonzero(delta.reshape(-1) == best))), width)
            p = int(rng.choice(np.flatnonzero(table[r] == c)))
            k = table[r2, q]
            n[r, c] -= 1; n[r, k] += 1; n[r2, k] -= 1; n[r2, c] += 1  # noqa: E702
            table[r, p], table[r2, q] = k, c
            perm[r, p], perm[r2, q] = perm[r2, q], perm[r, p]
            moved = True
        if not moved:
            return perm.reshape(-1)


def stages(labels: np.ndarray, kept: np.ndarray, num_classes: int, cfg: PartitionConfig,
           rng: np.random.Generator) -> StageLists:
    """GLDP's [N, S, M]: N clients, each with M sequential stage tasks of S classes.

    Reading of the STHFL (GLDP) paper. The setting ("[N, S, M] denotes that the number of clients is N
    and each client contains S classes, and M represents the stage tasks of each client", Sec.
    5.2) has N·M client stage tasks ("slots") of S classes each; the paper's own settings hold
    more class slots than classes ([20, 4, 5] and [20, 5, 5] on CIFAR-10: 400 and 500 slots of
    10 classes; [20, 30, 5] on CIFAR-100), and "the classes in the current stage task may not be
    seen in previous tasks" (Sec. 3, 2(b)), Eq. 9 updates an old class's prototype with new
    samples and β = 0.5 trades "the new and old sample knowledge of the same class": so a class
    may come back in a later stage of the same client. The classes of one stage are distinct.
    The data are cut from the long-tailed pool ("from a global perspective, the data
    distribution is long-tailed", Sec. 3, 1(b)), all of it used once every class has a slot.

    - default: every class takes floor or ceil of N·M·S/C slots (which classes get one more: a
      seeded choice), the class slots are shuffled and dealt S to a slot, and repeats within a
      slot are exchanged away (:func:`distinct_rows`); a class's kept samples are shuffled and
      split evenly among its slots, so client sizes follow the long tail. A stage's classes are
      its S slots.
    - ``--balanced`` (the paper's: "each client is assigned the same number of training samples
      but with different class distributions", Sec. 5.1, after FedRep [14]): the pool, sorted by
      label (random order within a class), is cut into N·M·S shards of equal size (±1), as
      FedAvg's label shards; the shards are shuffled and dealt S to a slot, exchanging away a
      slot's second shard of the same (majority) label where the shard counts allow. Every
      client gets M·S shards (equal sizes up to M·S samples), a slot's classes follow the long
      tail (a head class has more shards than a tail class; one with more shards than there are
      slots fills some slot twice, which then holds fewer than S classes), and "the data for
      each class is unbalanced in any stage tasks of clients" (Sec. 3, 1(b)): a shard can
      straddle two labels. A stage's classes are the labels its samples have.

    Slot r = client i's stage k with r = i·M + k.
    """
    n, s, m = cfg.num_clients, cfg.classes_per_stage, cfg.stages
    slots = n * m
    if cfg.balanced:
        return _stage_shards(labels, kept, num_classes, cfg, rng)
    counts = np.full(num_classes, slots * s // num_classes, dtype=np.int64)
    counts[rng.permutation(num_classes)[: slots * s % num_classes]] += 1
    deck = rng.permutation(np.repeat(np.arange(num_classes), counts))
    table = deck[distinct_rows(deck.reshape(slots, s), rng)].reshape(slots, s)
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    for r in range(slots):
        for c in table[r]:
            holders[int(c)].append(r)
    pools = _by_class(labels, kept, num_classes)
    share: list[dict[int, np.ndarray]] = [{} for _ in range(slots)]
    for c in range(num_classes):
        if holders[c]:
            for r, part in zip(holders[c], np.array_split(rng.permutation(pools[c]), len(holders[c]))):
                share[r][c] = part.astype(np.int64)
    out: StageLists = []
    for i in range(n):
        client_stages = []
        for k in range(m):
            r = i * m + k
            stage_cls = np.sort(table[r]).astype(np.int64)
            client_stages.append((stage_cls, _concat([share[r][int(c)] for c in stage_cls])))
        out.append(client_stages)
    return out


def _stage_shards(labels: np.ndarray, kept: np.ndarray, num_classes: int, cfg: PartitionConfig,
                  rng: np.random.Generator) -> StageLists:
    """``--balanced`` stage tasks: S equal label shards per slot (see :func:`stages`)."""
    n, s, m = cfg.num_clients, cfg.classes_per_stage, cfg.stages
    slots = n * m
    if len(kept) < slots * s:
        raise ConfigError(
            f"--balanced cuts {n} clients × {m} stages × {s} classes = {slots * s} shards from the {len(kept)} "
            "training samples kept after the long-tail cut; lower --clients, --stages or --classes-per-stage, "
            "or use a smaller --imbalance")
    ordered = _concat([rng.permutation(p) for p in _by_class(labels, kept, num_classes)])
    shards = np.array_split(ordered, slots * s)
    majority = np.array([np.bincount(labels[sh], minlength=num_classes).argmax() for sh in shards])
    deal = rng.permutation(slots * s)
    table = deal[distinct_rows(majority[deal].reshape(slots, s), rng)].reshape(slots, s)
    out: StageLists = []
    for i in range(n):
        client_stages = []
        for k in range(m):
            idx = _concat([shards[j] for j in table[i * m + k]])
            client_stages.append((np.unique(labels[idx]).astype(np.int64), idx))
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
