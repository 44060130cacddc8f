"""Linear probe and few-shot evaluation on frozen features.

Linear probe (El Banani et al. 2023 §4, after Radford et al. 2021 App. A.3; the protocol Hammoud & Ghanem 2025 §4
follow): L-BFGS logistic regression on frozen features. The inverse regularisation C is chosen by a coarse sweep
over C ∈ {10⁻⁶, 10⁻⁵, …, 10⁶} and then a fine sweep over 10^(c* + δ), δ ∈ {−2, −1.75, …, 2} around the best coarse
exponent c*, both scored by accuracy on a validation split (the given one, or a stratified 20% of the training
set, a random 20% where a class has a single row); the model is then refit on train + validation with the
chosen C and tested once. Each sweep runs in increasing C, every fit starting from the previous one's weights (a
warm start: the regularisation path), and the fits run on one BLAS thread: these are small dense problems
(thousands × tens), where a pool of BLAS threads spends most of its time waiting on a busy machine (100× slower
measured on 2 shared cores).

Few-shot (El Banani et al. 2023 §4; SimpleShot, Wang et al. 2019): N-way K-shot episodes with Q queries per class
(default 5-way 5-shot, 6 queries, 5000 episodes). Features are centred (minus the mean of all features given) and
L2-normalised; each class's prototype is the mean of its K support features; a query takes the class of the
nearest prototype (Euclidean). Reported: mean ± standard deviation of the per-episode accuracy.
"""

from __future__ import annotations

import numpy as np
import torch

from ..progress import progress as progress_bar
from ._checks import as_tensor, check_int

__all__ = ["COARSE_C", "linear_probe", "prototype_accuracy", "few_shot"]

COARSE_C: tuple[float, ...] = tuple(10.0 ** e for e in range(-6, 7))


def _features(name: str, x) -> np.ndarray:
    return as_tensor(name, x, dim=2, floating=True).detach().cpu().double().numpy()


def _labels(name: str, y, n: int) -> np.ndarray:
    y = as_tensor(name, y, dim=1, floating=False).cpu().numpy()
    if len(y) != n:
        raise ValueError(f"{name} must have one label per feature row ({n}), got {len(y)}")
    return y


def _fit_score(c: float, x_tr, y_tr, x_ev, y_ev, max_iter: int, clf=None) -> tuple[float, object]:
    """Fit at ``c`` (from ``clf``'s weights when given: a warm start) and score on the evaluation rows."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    if clf is None:
        clf = LogisticRegression(C=c, solver="lbfgs", max_iter=max_iter, warm_start=True)
    clf.set_params(C=c)
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x_tr, y_tr)
    return float((clf.predict(x_ev) == y_ev).mean()), clf


def linear_probe(train_features, train_labels, test_features, test_labels, *, val_features=None,
                 val_labels=None, val_fraction: float = 0.2, coarse_c=COARSE_C, fine_decades: float = 2.0,
                 fine_steps: int = 17, max_iter: int = 1000, seed: int = 0, progress: bool = False) -> dict:
    """Fit the L-BFGS logistic-regression probe with the C sweep of the module docstring (``progress``: a bar over
    the fits, :func:`diffattn.progress.progress`).

    Returns ``{"accuracy", "mean_per_class_recall", "C", "val_accuracy", "sweep"}`` where ``sweep`` maps each C
    tried to its validation accuracy. Accuracies are fractions in [0, 1]. Ties between C values go to the smaller
    C (stronger regularisation).
    """
    x_tr = _features("train_features", train_features)
    y_tr = _labels("train_labels", train_labels, len(x_tr))
    x_te = _features("test_features", test_features)
    y_te = _labels("test_labels", test_labels, len(x_te))
    if x_te.shape[1] != x_tr.shape[1]:
        raise ValueError(f"test_features must have {x_tr.shape[1]} columns like train_features, got {x_te.shape[1]}")
    if (val_features is None) != (val_labels is None):
        raise ValueError("val_features and val_labels must be given together")
    if val_features is None:
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        from sklearn.model_selection import train_test_split

        # stratified where every class has two rows to split (a sample of a long-tailed set may hold one)
        stratify = y_tr if np.unique(y_tr, return_counts=True)[1].min() >= 2 else None
        x_fit, x_val, y_fit, y_val = train_test_split(x_tr, y_tr, test_size=val_fraction, stratify=stratify,
                                                      random_state=seed)
    else:
        x_fit, y_fit = x_tr, y_tr
        x_val = _features("val_features", val_features)
        y_val = _labels("val_labels", val_labels, len(x_val))
    if len(np.unique(y_fit)) < 2:
        raise ValueError("train_labels must hold at least two classes")
    sweep: dict[float, float] = {}
    bar = progress_bar(total=len(set(coarse_c)) + fine_steps + 1, desc="linear probe", unit="fit",
                       disable=not progress, leave=False)

    def best(cs):
        clf = None
        for c in sorted(cs):  # increasing C, each fit warm-started from the last
            if c not in sweep:
                sweep[c], clf = _fit_score(c, x_fit, y_fit, x_val, y_val, max_iter, clf)
                bar.update(1)
        return max(sorted(cs), key=lambda c: sweep[c])  # first (smallest) C among the best

    c_coarse = best([float(c) for c in coarse_c])
    e = np.log10(c_coarse)
    fine = [float(10.0 ** (e + d)) for d in np.linspace(-fine_decades, fine_decades, fine_steps)]
    bar.total = len(sweep) + len(set(fine) - set(sweep)) + 1  # the fine sweep reuses the coarse fits it meets
    c_best = best(sorted(set(fine) | {c_coarse}))
    if val_features is None:
        x_all, y_all = x_tr, y_tr
    else:
        x_all, y_all = np.concatenate([x_fit, x_val]), np.concatenate([y_fit, y_val])
    acc, clf = _fit_score(c_best, x_all, y_all, x_te, y_te, max_iter)
    bar.update(1)
    bar.close()
    pred = clf.predict(x_te)
    recall = float(np.mean([(pred[y_te == c] == c).mean() for c in np.unique(y_te)]))
    return {"accuracy": acc, "mean_per_class_recall": recall, "C": c_best, "val_accuracy": sweep[c_best],
            "sweep": dict(sorted(sweep.items()))}


def prototype_accuracy(support: torch.Tensor, support_labels: torch.Tensor, query: torch.Tensor,
                       query_labels: torch.Tensor) -> float:
    """Nearest-prototype accuracy of one episode: prototypes p_c = mean of class c's support rows, each query
    takes argmin_c ‖q − p_c‖₂ (ties go to the smaller class id). Features are used as given."""
    support = as_tensor("support", support, dim=2, floating=True)
    query = as_tensor("query", query, dim=2, floating=True)
    support_labels = as_tensor("support_labels", support_labels, dim=1, floating=False)
    query_labels = as_tensor("query_labels", query_labels, dim=1, floating=False)
    classes = support_labels.unique()  # sorted
    protos = torch.stack([support[support_labels == c].mean(dim=0) for c in classes])  # (C, E)
    dist = torch.cdist(query.double(), protos.double())  # (Q, C)
    pred = classes[dist.argmin(dim=1)]
    return (pred == query_labels).double().mean().item()


def few_shot(features, labels, *, n_way: int = 5, n_shot: int = 5, n_query: int = 6, episodes: int = 5000,
             seed: int = 0, progress: bool = False) -> dict[str, float]:
    """``{"mean", "std", "episodes", "way", "shot", "queries"}``: N-way K-shot nearest-prototype accuracy over
    random episodes, on centred and L2-normalised features (module docstring); chance is 1/N. Each episode draws
    ``n_way`` classes among those with at least ``n_shot + n_query`` examples, then disjoint support and query
    examples per class. ``progress``: a bar over the episodes."""
    x = as_tensor("features", features, dim=2, floating=True).double()
    y = as_tensor("labels", labels, dim=1, floating=False)
    for name, v in (("n_way", n_way), ("n_shot", n_shot), ("n_query", n_query), ("episodes", episodes)):
        check_int(name, v)
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"labels must have one entry per feature row ({x.shape[0]}), got {y.shape[0]}")
    x = x - x.mean(dim=0, keepdim=True)
    x = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    by_class = {int(c): torch.nonzero(y == c).flatten() for c in y.unique()}
    eligible = [c for c, idx in by_class.items() if len(idx) >= n_shot + n_query]
    if len(eligible) < n_way:
        raise ValueError(f"n_way={n_way} needs that many classes with at least n_shot + n_query = "
                         f"{n_shot + n_query} examples; only {len(eligible)} have enough")
    g = torch.Generator().manual_seed(seed)
    target = torch.arange(n_way).repeat_interleave(n_query)  # (W·Q,) episode-local class ids
    accs = []
    bar = progress_bar(total=episodes, desc="few-shot", unit="episode", disable=not progress, leave=False)
    for start in range(0, episodes, 256):  # episodes in batches: (B, W, K + Q) indices gathered at once
        idx = []
        for _ in range(min(256, episodes - start)):
            chosen = [eligible[i] for i in torch.randperm(len(eligible), generator=g)[:n_way].tolist()]
            idx.append(torch.stack([by_class[c][torch.randperm(len(by_class[c]), generator=g)[:n_shot + n_query]]
                                    for c in chosen]))
        f = x[torch.stack(idx)]  # (B, W, K + Q, E)
        protos = f[:, :, :n_shot].mean(dim=2)  # (B, W, E)
        queries = f[:, :, n_shot:].flatten(1, 2)  # (B, W·Q, E)
        pred = torch.cdist(queries, protos).argmin(dim=-1)  # (B, W·Q), ties to the first prototype
        accs.append((pred == target).double().mean(dim=1))
        bar.update(len(idx))
    bar.close()
    a = torch.cat(accs)
    return {"mean": a.mean().item(), "std": a.std(unbiased=False).item(), "episodes": episodes, "way": n_way,
            "shot": n_shot, "queries": n_query}
