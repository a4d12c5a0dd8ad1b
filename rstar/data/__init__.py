"""Problem data: loading, curation, hard-sample mining, synthetic problems and SFT examples.

Parquet schemas live in `rstar.data.schema` (documented in docs/schemas.md); every write is
atomic and every read checks the file is what it claims to be (`rstar.data.io`).
"""


def check_names(kind: str, names, known) -> None:
    """Raise ValueError naming every one of `names` that is not in `known`."""
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown {kind} {unknown}; known: {sorted(known)}")
