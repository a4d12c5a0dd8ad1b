"""Problem data: loading, curation, hard-sample mining, synthetic problems and SFT examples.

Parquet schemas live in `rstar.data.schema` (documented in docs/schemas.md); every write is
atomic and every read checks the file is what it claims to be (`rstar.data.io`).
"""
