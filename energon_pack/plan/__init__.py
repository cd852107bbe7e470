"""Global pack plans: rows planned once for a whole split (``energon-pack plan``), read by a
loader whose state is one global row cursor, valid for any data-parallel size and worker count.

``file``: the on-disk plan (rows of Energon sample indices, fingerprint, skips);
``build``: header-only measurement of a split and global packing;
``loader``: ``PlanDataLoader`` (rows by restore key, elastic state).
"""
