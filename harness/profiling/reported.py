"""The papers' own complexity figures, shown as separate "reported" rows.

ARL paper (docs/references.md): Table 3 (FLOPs, params) and Table 4 (runtime per text
query, ms, collections of 1,000..2,500 videos), all "on Nvidia RTX 3090 GPU" (its
Complexity Analysis paragraph). RAL paper (docs/references.md): Table 6 (FLOPs, params) and
Table 7 (runtime, ms, 500..2,500 videos, "a video subset from the TVR dataset"); its
experiments run "on a single A800 GPU". Neither paper says which FLOP counter it used nor
what one query's FLOPs include. Keys are our method names.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reported:
    method: str  # our method name (the row it stands beside)
    model: str  # the paper's name for the model
    source: str  # "reported, <GPU>"
    tables: str  # where in which paper
    params_m: float | None = None
    flops_g: float | None = None
    runtime_ms: dict[int, float] = field(default_factory=dict)  # collection size -> ms per query


ARL_3090 = "reported, RTX 3090"
RAL_A800 = "reported, A800"

REPORTED: tuple[Reported, ...] = (
    Reported("msl", "MS-SL", ARL_3090, "ARL paper Tables 3, 4", 4.85, 1.29,
             {1000: 0.366, 1500: 0.606, 2000: 0.759, 2500: 0.893}),
    Reported("gmmformer", "GMMFormer", ARL_3090, "ARL paper Tables 3, 4", 12.85, 1.95,
             {1000: 0.264, 1500: 0.267, 2000: 0.270, 2500: 0.293}),
    Reported("arl", "ARL", ARL_3090, "ARL paper Tables 3, 4", 5.34, 1.23,
             {1000: 0.294, 1500: 0.391, 2000: 0.427, 2500: 0.612}),
    Reported("msl", "MS-SL", RAL_A800, "RAL paper Tables 6, 7", 4.85, 1.29,
             {500: 4.89, 1000: 6.11, 1500: 8.06, 2000: 10.42, 2500: 12.93}),
    Reported("gmmformer", "GMMFormer", RAL_A800, "RAL paper Tables 6, 7", 12.85, 1.95,
             {500: 2.68, 1000: 2.93, 1500: 3.40, 2000: 3.94, 2500: 4.56}),
    Reported("gmmformer2", "GMMFormer v2", RAL_A800, "RAL paper Tables 6, 7", 32.27, 5.43,
             {500: 3.95, 1000: 4.32, 1500: 5.02, 2000: 5.81, 2500: 6.73}),
    Reported("ral", "RAL (on GMMFormer v2)", RAL_A800, "RAL paper Tables 6, 7", 35.53, 5.75,
             {500: 4.61, 1000: 5.05, 1500: 5.86, 2000: 6.79, 2500: 7.86}),
)


def reported_for(methods: list[str] | None) -> list[Reported]:
    """The reported rows of these methods (all of them when `methods` is None)."""
    return [r for r in REPORTED if methods is None or r.method in methods]
