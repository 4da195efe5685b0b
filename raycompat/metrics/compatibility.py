"""Compatibility matrix and the scalar metrics derived from it (REFERENCE.md, "Compatibility
metrics"; CoReS eq. 3, 4, 8, 9; d-Simplex-HOC sec. 5.1; CL2R code for BC and FC).

``C[t, k] = M(t, k)`` for ``t >= k`` (query model t, gallery model k, 0-based here), 0 above the
diagonal (HOC eq. 7). Every function accepts a ``(T, T)`` array or a :class:`CompatibilityMatrix`.

Empirical compatibility criterion (ECC): ``C[t, k] > C[k, k]`` with ``strict=True`` (CoReS,
CL2R), ``>=`` with ``strict=False`` (IAM-CL2R code). For a metric where lower is better (an error
rate), a container with ``higher_is_better=False`` flips the comparison; plain arrays are taken as
higher-is-better. With T = 1 there is no cross-test: AC, ACA, BC and FC are 0/0 and return nan
(the CL2R code returns AC = 1 there); AA is the single self-test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


class CompatibilityMatrix:
    """Lower-triangular ``T x T`` matrix of ``M(t, k)`` filled one model (row) at a time."""

    def __init__(self, metric: str = "accuracy", higher_is_better: bool = True) -> None:
        self.metric, self.higher_is_better = metric, higher_is_better
        self.names: list[str] = []
        self.rows: list[list[float]] = []

    @classmethod
    def from_array(
        cls,
        values: Any,
        names: list[str] | None = None,
        metric: str = "accuracy",
        higher_is_better: bool = True,
    ) -> CompatibilityMatrix:
        """Build from a ``(T, T)`` array; entries above the diagonal are ignored."""
        arr, _ = _matrix(values)
        if names is not None and len(names) != arr.shape[0]:
            raise ValueError(f"{len(names)} names for a {arr.shape[0]} x {arr.shape[0]} matrix")
        out = cls(metric, higher_is_better)
        for t in range(arr.shape[0]):
            out.add_row(arr[t, : t + 1], None if names is None else names[t])
        return out

    def add_row(self, values: Any, name: str | None = None) -> None:
        """Append model t: ``values = [M(t, 0), ..., M(t, t-1), M(t, t)]`` (self-test last)."""
        row = np.asarray(values, dtype=np.float64).reshape(-1)
        t = len(self.rows)
        if row.shape[0] != t + 1:
            raise ValueError(
                f"row {t} needs {t + 1} values (against models 0..{t}), got {row.shape[0]}"
            )
        if not np.isfinite(row).all():
            raise ValueError(
                f"row {t} has a non-finite value at column "
                f"{int(np.nonzero(~np.isfinite(row))[0][0])}: {row.tolist()}"
            )
        self.rows.append(row.tolist())
        self.names.append(name if name is not None else f"model_{t}")

    def __len__(self) -> int:
        return len(self.rows)

    def as_array(self) -> np.ndarray:
        out = np.zeros((len(self), len(self)))
        for t, row in enumerate(self.rows):
            out[t, : t + 1] = row
        return out

    def __getitem__(self, key: Any) -> Any:
        return self.as_array()[key]

    def to_json(self) -> str:
        return json.dumps(
            {
                "metric": self.metric,
                "higher_is_better": self.higher_is_better,
                "names": self.names,
                "rows": self.rows,
            }
        )

    @classmethod
    def from_json(cls, text: str, source: str = "json") -> CompatibilityMatrix:
        data = json.loads(text)
        missing = {"metric", "higher_is_better", "names", "rows"} - set(data)
        if missing:
            raise KeyError(f"{source}: missing key(s) {sorted(missing)}")
        if len(data["names"]) != len(data["rows"]):
            raise ValueError(f"{source}: {len(data['names'])} names for {len(data['rows'])} rows")
        out = cls(data["metric"], bool(data["higher_is_better"]))
        for name, row in zip(data["names"], data["rows"], strict=True):
            out.add_row(row, name)
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> CompatibilityMatrix:
        if not Path(path).is_file():
            raise FileNotFoundError(f"compatibility matrix file {path} does not exist")
        return cls.from_json(Path(path).read_text(), source=str(path))


def _matrix(C: Any) -> tuple[np.ndarray, bool]:
    """``(T, T)`` float array (sign-flipped for lower-is-better) and the original sign."""
    if isinstance(C, CompatibilityMatrix):
        arr, higher = C.as_array(), C.higher_is_better
    else:
        arr, higher = np.asarray(C, dtype=np.float64), True
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] == 0:
        raise ValueError(f"a compatibility matrix must be square (T, T), T >= 1; got {arr.shape}")
    bad = np.argwhere(~np.isfinite(np.where(np.tri(arr.shape[0], dtype=bool), arr, 0.0)))
    if bad.size:
        raise ValueError(f"compatibility matrix entry C[{bad[0][0]}, {bad[0][1]}] is not finite")
    return arr, higher


def ecc(cross: float, self_: float, strict: bool = True, higher_is_better: bool = True) -> bool:
    """Empirical compatibility criterion M(new, old) > M(old, old) (CoReS eq. 3)."""
    if not higher_is_better:
        cross, self_ = -cross, -self_
    return bool(cross > self_) if strict else bool(cross >= self_)


def _compatible(C: Any, strict: bool) -> tuple[np.ndarray, np.ndarray]:
    """Matrix and boolean mask of the cross-tests (t > k) that satisfy ECC."""
    arr, higher = _matrix(C)
    signed = arr if higher else -arr
    diag = np.diag(signed)[None, :]
    passed = signed > diag if strict else signed >= diag
    return arr, passed & np.tri(arr.shape[0], k=-1, dtype=bool)


def _pairs(T: int) -> float:
    return T * (T - 1) / 2 if T > 1 else float("nan")


def average_compatibility(C: Any, strict: bool = True) -> float:
    """AC = 2/(T(T-1)) sum_{t>k} 1[C[t,k] > C[k,k]] (CoReS eq. 8). nan for T = 1."""
    arr, passed = _compatible(C, strict)
    return float(passed.sum() / _pairs(arr.shape[0]))


def average_accuracy(C: Any) -> float:
    """AA (CoReS' AM, eq. 9) = 2/(T(T+1)) sum_{t>=k} C[t,k], diagonal included."""
    arr, _ = _matrix(C)
    return float(arr[np.tri(arr.shape[0], dtype=bool)].mean())


def average_compatibility_accuracy(C: Any, strict: bool = True) -> float:
    """ACA = 2/(T(T-1)) sum_{t>k} C[t,k] 1[C[t,k] > C[k,k]] (HOC sec. 5.1, as its tables are
    computed; the printed formula omits the C[t,k] factor). nan for T = 1."""
    arr, passed = _compatible(C, strict)
    return float(arr[passed].sum() / _pairs(arr.shape[0]))


def _block(C: Any, tau: int) -> CompatibilityMatrix:
    arr, higher = _matrix(C)
    if not 1 <= tau <= arr.shape[0]:
        raise ValueError(f"tau must be in [1, T={arr.shape[0]}], got {tau}")
    return CompatibilityMatrix.from_array(arr[:tau, :tau], higher_is_better=higher)


def average_compatibility_tau(C: Any, tau: int, strict: bool = True) -> float:
    """AC_tau: AC of the top-left tau x tau block (models 1..tau)."""
    return average_compatibility(_block(C, tau), strict)


def average_accuracy_tau(C: Any, tau: int) -> float:
    """AA_tau: AA of the top-left tau x tau block."""
    return average_accuracy(_block(C, tau))


def average_compatibility_accuracy_tau(C: Any, tau: int, strict: bool = True) -> float:
    """ACA_tau: ACA of the top-left tau x tau block."""
    return average_compatibility_accuracy(_block(C, tau), strict)


def update_gain(m_new_old: float, m_old_old: float, m_up_up: float) -> float:
    """(M(new, old) - M(old, old)) / (M(up, up) - M(old, old)) (BCT; CoReS eq. 4)."""
    if m_up_up == m_old_old:
        raise ValueError(f"update gain is undefined: M(up, up) == M(old, old) == {m_old_old}")
    return (m_new_old - m_old_old) / (m_up_up - m_old_old)


def backward_compatibility(C: Any) -> float:
    """BC = mean_{i<T} (C[T,i] - C[i,i]): last model's queries vs every older gallery (CL2R).

    A raw difference: positive means better only when higher is better. nan for T = 1."""
    arr, _ = _matrix(C)
    T = arr.shape[0]
    return float(np.mean(arr[T - 1, : T - 1] - np.diag(arr)[: T - 1])) if T > 1 else float("nan")


def forward_compatibility(C: Any) -> float:
    """FC = mean_{i>1} (C[i,i-1] - C[i,i]): each model against its predecessor's gallery (CL2R).

    A raw difference like BC. nan for T = 1."""
    arr, _ = _matrix(C)
    if arr.shape[0] == 1:
        return float("nan")
    return float(np.mean(np.diag(arr, k=-1) - np.diag(arr)[1:]))


def compatibility_report(C: Any, strict: bool = True) -> dict[str, Any]:
    """All scalar metrics of C in one dict (``T``, ``AC``, ``AA``, ``ACA``, ``BC``, ``FC``)."""
    return {
        "T": _matrix(C)[0].shape[0],
        "strict": strict,
        "AC": average_compatibility(C, strict),
        "AA": average_accuracy(C),
        "ACA": average_compatibility_accuracy(C, strict),
        "BC": backward_compatibility(C),
        "FC": forward_compatibility(C),
    }
