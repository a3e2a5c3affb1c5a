"""`scalify-hlo audit`: every collective of a distributed program with its mesh axes and traffic.

Bytes are what one device sends (and receives) per execution with the usual ring algorithms (`BYTE_MODEL`):
all-reduce 2·(n-1)/n·S, all-gather and reduce-scatter (n-1)/n of the gathered / scattered tensor,
all-to-all (n-1)/n·S, collective-permute S (S the per-device operand, n the group size). A collective
inside `while` loops runs once per iteration: per step it counts × the loops' trip counts when they are
static (a counter from a constant compared with a constant, stepped by a constant: `fori_loop`, `scan`).
Layers of an unrolled model are found as repetitions of the same sequence of collectives (kind and source
line); those of a scanned one are the iterations of the loop that holds the collectives.

Mesh axes are named as the user named them: the module's `sdy.mesh`, else the reference program's
(`reference=`, the program before partitioning: partitioned HLO keeps no axis names); without either
they are numbered by position (axis_0, ...), and the report says so.
Collective-permutes are listed with the mesh axes their pairs move along; every output with its sharding
(declared by the module, else by the reference). Flags: large tensors replicated on every device; an input
left whole over an axis that inputs of the same global shape are split over (optimizer state replicated
where its parameters are FSDP/zero-1 sharded); all-gather followed by a slice of the same data (resharding
ping-pong); the same data gathered twice over the same devices; collectives over size-1 groups; and
reductions of values that are not partial (from the prover's facts: a reduction performed twice).

Modules: `collect.py` (`audit()`), `ops.py` (what is read off one op), `flags.py`, `report.py` (the data and
its renderings).
"""

from scalify_hlo.audit.collect import audit
from scalify_hlo.audit.report import Audit, Collective, plot

__all__ = ["Audit", "Collective", "audit", "plot"]
