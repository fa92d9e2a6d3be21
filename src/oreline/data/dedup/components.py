"""Connected components of the verified near-duplicate edges, in memory proportional to the edges.

Only documents on some edge are ever held: the edges' endpoints are mapped to dense indexes
(`np.unique`), so the union-find arrays have one entry per touched document, never one per
document of the corpus. Memory: 16 bytes per edge (the edge array) + about 40 bytes per touched
document (index, parent, size, label), whatever the corpus size.

When the edges of a run exceed one node, `large_star` / `small_star` (Kiveris et al., "Connected
Components in MapReduce and Beyond", SoCC 2014) are the distributed form: each is a group-by over
one endpoint, so a round is one shuffle of the edges, and O(log² n) rounds (a handful in practice:
near-duplicate clusters are small) leave every node linked to its component's minimum.
`plan.star_components` runs those rounds as executor jobs over edge partitions; here they are
written over one edge array, which is what each partition's job computes.

The survivor of a component (lowest rank) is chosen afterwards, from the touched documents' sort
keys (`near_duplicate_clusters` here, `staged.components.components_job` in the staged plan).
"""

from __future__ import annotations

import numpy as np


class UnionFind:
    """Disjoint sets over 0..n-1 with path halving and union by size."""

    def __init__(self, n: int):
        self.parent = np.arange(n, dtype=np.int64)
        self.size = np.ones(n, dtype=np.int64)

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return int(x)

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        if self.size[ra] < self.size[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.size[ra] += self.size[rb]
        return ra

    def roots(self) -> np.ndarray:
        return np.fromiter(
            (self.find(i) for i in range(len(self.parent))), dtype=np.int64, count=len(self.parent)
        )


def components(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, labels): the sorted endpoints of `edges` (E, 2) and, for each, its component's
    smallest node. Union-find over the touched nodes only."""
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    nodes, dense = np.unique(edges.ravel(), return_inverse=True)
    dense = dense.reshape(-1, 2)
    uf = UnionFind(len(nodes))
    for a, b in dense.tolist():
        uf.union(a, b)
    roots = uf.roots()
    smallest = np.full(len(nodes), len(nodes), dtype=np.int64)
    np.minimum.at(smallest, roots, np.arange(len(nodes)))  # nodes are sorted: the first index is the min
    return nodes, nodes[smallest[roots]]


def group_min(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique keys, min of values per key)."""
    uniq, inv = np.unique(keys, return_inverse=True)
    out = uniq.copy()
    np.minimum.at(out, inv, values)
    return uniq, out


def _unique_edges(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    keep = a != b
    if not keep.any():
        return np.empty((0, 2), dtype=np.int64)
    e = np.stack((np.minimum(a[keep], b[keep]), np.maximum(a[keep], b[keep])), axis=1)
    return np.unique(e, axis=0)


def large_star(edges: np.ndarray) -> np.ndarray:
    """Every node u links its larger neighbours to m(u) = min(u, N(u))."""
    if not len(edges):
        return edges
    u = np.concatenate((edges[:, 0], edges[:, 1]))
    v = np.concatenate((edges[:, 1], edges[:, 0]))
    uniq, m = group_min(u, v)
    mu = m[np.searchsorted(uniq, u)]
    big = v > u
    return _unique_edges(v[big], mu[big])


def small_star(edges: np.ndarray) -> np.ndarray:
    """Every node u links itself and its smaller neighbours to m(u) = min(u, smaller N(u))."""
    if not len(edges):
        return edges
    lo, hi = edges.min(axis=1), edges.max(axis=1)
    uniq, m = group_min(hi, lo)
    mu = m[np.searchsorted(uniq, hi)]
    return _unique_edges(np.concatenate((lo, uniq)), np.concatenate((mu, m)))


def star_components(edges: np.ndarray, max_rounds: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, labels) like `components`, by alternating large-star and small-star until stable."""
    e = _unique_edges(*np.asarray(edges, dtype=np.int64).reshape(-1, 2).T)
    for _ in range(max_rounds):
        nxt = small_star(large_star(e))
        if np.array_equal(nxt, e):
            break
        e = nxt
    else:
        raise RuntimeError(f"large-star/small-star did not converge in {max_rounds} rounds")
    return star_labels(e)


def star_labels(star_edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, labels) of a converged star graph: each node's label is its smallest neighbour or itself."""
    if not len(star_edges):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    u = np.concatenate((star_edges[:, 0], star_edges[:, 1]))
    v = np.concatenate((star_edges[:, 1], star_edges[:, 0]))
    nodes, m = group_min(u, v)
    return nodes, np.minimum(nodes, m)


def near_duplicate_clusters(n: int, edges: np.ndarray, rank: np.ndarray) -> dict[int, int]:
    """{row: survivor_row} for every non-survivor in a component of `edges` (survivor: lowest rank).

    `n` (the number of rows) is accepted for the callers' sake; memory depends on the edges only.
    """
    del n
    if not len(edges):
        return {}
    nodes, labels = components(edges)
    order = np.lexsort((rank[nodes], labels))  # by component, then rank: survivor first
    first = np.concatenate(([True], labels[order][1:] != labels[order][:-1]))
    survivor_of = nodes[order][np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))]
    removed = {int(r): int(k) for r, k in zip(nodes[order], survivor_of, strict=True) if r != k}
    return dict(sorted(removed.items()))
